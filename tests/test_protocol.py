"""The committed generated code matches proto/, and the server speaks standard gRPC extras."""

from __future__ import annotations

from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tracehouse import protogen


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    fresh = {p.relative_to(tmp_path).as_posix(): p for p in protogen.generate(tmp_path)}
    committed_dir = protogen.REPO / protogen.PACKAGE
    committed = {
        p.relative_to(protogen.REPO).as_posix(): p
        for p in committed_dir.iterdir()
        if p.name.endswith(("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"))
    }
    assert sorted(fresh) == sorted(committed), "run `python -m tracehouse.protogen` and commit"
    for name, path in fresh.items():
        assert protogen.normalized(path.read_text()) == protogen.normalized(committed[name].read_text()), (
            f"{name} is stale: run `python -m tracehouse.protogen` and commit"
        )


def test_normalizing_ignores_only_generator_versions() -> None:
    text = "# Protobuf Python Version: 7.35.1\nx = 1\nGRPC_GENERATED_VERSION = '1.85.1'\n"
    assert protogen.normalized(text) == "x = 1\n"
    assert protogen.normalized("x = 2\n") != protogen.normalized("x = 1\n")


def test_health_check_answers_serving(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", "tracehouse.v1.Ingest", "tracehouse.v1.Query"):
        answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_services(channel: grpc.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    names = {s.name for answer in answers for s in answer.list_services_response.service}
    assert {"tracehouse.v1.Ingest", "tracehouse.v1.Query", "grpc.health.v1.Health"} <= names
    answers = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="tracehouse.v1.Ingest")]),
        timeout=5,
    )
    described = [answer.file_descriptor_response.file_descriptor_proto for answer in answers]
    assert described and described[0], "reflection returns the descriptor grpcurl needs"
