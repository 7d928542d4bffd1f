#!/usr/bin/env python3
"""Health check shipped in the tracehouse image as `tracehouse-healthcheck`, for compose
healthchecks and Kubernetes probes.

    tracehouse-healthcheck grpc 127.0.0.1:50051 [--tls-ca PEM [--server-name NAME]] [--tls-cert PEM --tls-key PEM]
    tracehouse-healthcheck http http://127.0.0.1:8501/_stcore/health

`grpc` asks the standard gRPC health service, which `tracehouse serve` answers without a token,
and succeeds on SERVING; serve says NOT_SERVING while its ClickHouse store is out of reach, so a
probe on it takes the server out of a load balancer until the store is back. Kubelet's own gRPC
probe cannot speak TLS; this can. `http` wants a 200 (the explorer's Streamlit health endpoint).
Exit status 0 when healthy, otherwise 1 with one line on stderr that says why.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracehouse-healthcheck", description="Is a tracehouse process healthy?")
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    grpc_check = kinds.add_parser("grpc", help="the gRPC health service of tracehouse serve")
    grpc_check.add_argument("address", help="host:port")
    grpc_check.add_argument("--service", default="", help="a service name (default: the whole server)")
    grpc_check.add_argument("--tls-ca", type=Path, default=None, help="CA of the server's certificate: speak TLS")
    grpc_check.add_argument("--tls-cert", type=Path, default=None, help="client certificate, for a server with mTLS")
    grpc_check.add_argument("--tls-key", type=Path, default=None, help="the client certificate's key")
    grpc_check.add_argument(
        "--server-name",
        default=None,
        help="name the server's certificate is checked against (default: the host in ADDRESS)",
    )
    http_check = kinds.add_parser("http", help="an HTTP endpoint that answers 200 when healthy")
    http_check.add_argument("url")
    for check in (grpc_check, http_check):
        check.add_argument("--timeout", type=float, default=3.0, help="seconds (default %(default)s)")
    return parser


def check_grpc(args: argparse.Namespace) -> str | None:
    """None when the server says SERVING; otherwise what is wrong."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if args.tls_ca is None:
        channel = grpc.insecure_channel(args.address)
    else:
        try:
            credentials = grpc.ssl_channel_credentials(
                args.tls_ca.read_bytes(),
                args.tls_key.read_bytes() if args.tls_key else None,
                args.tls_cert.read_bytes() if args.tls_cert else None,
            )
        except OSError as error:
            return f"cannot read {error.filename}: {error.strerror}"
        options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
        channel = grpc.secure_channel(args.address, credentials, options)
    with channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as error:
            return f"{args.address}: {error.code().name}: {error.details()}"
    if answer.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{args.address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)}"
    return None


def check_http(args: argparse.Namespace) -> str | None:
    try:
        with urllib.request.urlopen(args.url, timeout=args.timeout) as answer:
            return None if answer.status == 200 else f"{args.url}: HTTP {answer.status}"
    except (urllib.error.URLError, OSError) as error:
        return f"{args.url}: {error}"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = check_grpc(args) if args.kind == "grpc" else check_http(args)
    if problem is None:
        return 0
    print(f"tracehouse-healthcheck: {problem}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
