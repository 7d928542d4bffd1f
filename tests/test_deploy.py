"""deploy/ against the code: every `tracehouse ...` command line in it parses with the CLI's own
parser, every TRACEHOUSE_* variable is one tracehouse.config knows, and the names, ports and
Secrets agree between the files. No Docker, Kubernetes or ClickHouse needed."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from store.migrations import retention
from tracehouse import config
from tracehouse.cli.main import build_parser

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
COMPOSE_FILES = (DEPLOY / "docker-compose.yml", DEPLOY / "clickhouse" / "docker-compose.yml")
KUBERNETES = DEPLOY / "kubernetes"
SYSTEMD = DEPLOY / "systemd"
CLICKHOUSE = DEPLOY / "clickhouse"

# the subcommands the product documents; a `tracehouse WORD` in prose or a shell line is a
# command line only when WORD is one of them
COMMAND_NAMES = ("serve", "up", "agent", "import", "query", "ui", "schema", "token", "bench")
# values for placeholders whose stand-in must be of a kind (`$1` in make-secrets.sh is a scope)
STAND_INS = {"1": "write"}
PLACEHOLDER = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}|\$\((\w+)\)|\$(\w+)")


@dataclass(frozen=True)
class Command:
    where: str  # the file, and the place in it
    argv: tuple[str, ...]  # the words after `tracehouse`


def expand(text: str, values: dict[str, str]) -> str:
    """${VAR}, ${VAR:-default}, $(VAR) and $VAR from `values`, else a default or a stand-in."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3) or match.group(4)
        default = match.group(2)
        return values.get(name, default if default is not None else STAND_INS.get(name, "placeholder"))

    return PLACEHOLDER.sub(one, text)


def option(argv: tuple[str, ...] | list[str], flag: str) -> list[str]:
    """The values given to `flag`, as `--flag VALUE` or `--flag=VALUE`."""
    values = []
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif word.startswith(flag + "="):
            values.append(word[len(flag) + 1 :])
    return values


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1].split("/")[0])


def parse_error(parser: Any, argv: list[str] | tuple[str, ...]) -> str | None:
    """None when argparse takes `argv`; otherwise its complaint."""
    complaint = io.StringIO()
    with contextlib.redirect_stderr(complaint), contextlib.redirect_stdout(io.StringIO()):
        try:
            args = parser.parse_args(list(argv))
        except SystemExit:
            return (complaint.getvalue().strip().splitlines() or ["exited"])[-1]
    try:
        retention(getattr(args, "retention", []))  # what serve itself checks after parsing
    except ValueError as error:
        return str(error)
    return None


def healthcheck_parser() -> Any:
    spec = importlib.util.spec_from_file_location("deploy_healthcheck", DEPLOY / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_parser()


# -- where command lines are ----------------------------------------------------------------


def compose(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def compose_argv(service: dict[str, Any]) -> list[str] | None:
    if not str(service.get("image", "")).startswith("tracehouse:"):
        return None
    command = service.get("command", [])
    return [expand(word, {}) for word in (shlex.split(command) if isinstance(command, str) else command)]


def manifests() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                yield path, document


def workloads() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path, document in manifests():
        if document["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
            yield path, document


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def kubernetes_argv(container: dict[str, Any]) -> list[str] | None:
    """What follows `tracehouse` in a container of the tracehouse image (ENTRYPOINT tracehouse)."""
    command = container.get("command")
    if not container["image"].startswith("tracehouse") or (command and command[0] != "tracehouse"):
        return None
    env = {item["name"]: item.get("value", "from-" + item["name"].lower()) for item in container.get("env", [])}
    return [expand(word, env) for word in [*(command or [])[1:], *container.get("args", [])]]


def env_file(text: str, commented: bool = False) -> list[tuple[str, str]]:
    """NAME=value lines of an environment file; with `commented`, those commented out instead."""
    pattern = re.compile(r"^#([A-Z_][A-Z0-9_]*)=(.*)$" if commented else r"^([A-Z_][A-Z0-9_]*)=(.*)$")
    return [(m.group(1), m.group(2).strip().strip('"')) for m in map(pattern.match, text.splitlines()) if m]


def unit_settings(path: Path) -> list[tuple[str, str]]:
    settings = []
    for line in path.read_text().splitlines():
        key, equals, value = line.partition("=")
        if equals and not line.startswith(("#", ";", "[")):
            settings.append((key.strip(), value.strip()))
    return settings


def systemd_commands() -> Iterator[Command]:
    """ExecStart with the unit's Environment= and its environment file, and once more with each
    commented-out alternative value of a variable that ExecStart uses."""
    for unit in sorted(SYSTEMD.glob("*.service")):
        settings = unit_settings(unit)
        values: dict[str, str] = {}
        for key, value in settings:
            if key == "Environment":
                values.update(word.partition("=")[::2] for word in shlex.split(value))
        alternatives: list[tuple[str, str]] = []
        for key, value in settings:
            if key == "EnvironmentFile":
                text = (SYSTEMD / Path(value.lstrip("-")).name).read_text()
                values.update(env_file(text))
                alternatives += env_file(text, commented=True)
        for key, exec_start in settings:
            if key != "ExecStart":
                continue
            used = {m.group(1) or m.group(4) for m in PLACEHOLDER.finditer(exec_start)}
            variants = [("", values)] + [
                (f" (#{name}=...)", {**values, name: value}) for name, value in alternatives if name in used
            ]
            for label, variant in variants:
                program, *argv = shlex.split(expand(exec_start, variant))
                assert program.endswith("/tracehouse"), f"{unit.name}: ExecStart runs {program}"
                yield Command(f"{unit.relative_to(DEPLOY)} ExecStart{label}", tuple(argv))


TEXT_COMMAND = re.compile(rf"(?:^|[\s\"'`(])tracehouse[ \t]+((?:{'|'.join(COMMAND_NAMES)})(?![\w-])[^|;&<>)`]*)")


def text_commands(path: Path, text: str) -> Iterator[Command]:
    """`tracehouse COMMAND ...` in shell lines (continued with a backslash), up to a pipe,
    redirection, `;`, `&&` or a comment."""
    number = 1
    for line in re.split(r"(?<!\\)\n", text):
        code = line.replace("\\\n", " ").partition(" #")[0]
        for match in TEXT_COMMAND.finditer("" if code.lstrip().startswith("#") else code):
            argv = [expand(word, {}) for word in shlex.split(match.group(1))]
            yield Command(f"{path.relative_to(DEPLOY)} line {number}", tuple(argv))
        number += line.count("\n") + 1


def markdown_code(text: str) -> str:
    """The fenced code blocks of a Markdown text, other lines blanked (line numbers kept)."""
    kept, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            kept.append("")
        else:
            kept.append(line if inside else "")
    return "\n".join(kept)


def all_commands() -> list[Command]:
    commands = []
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE)
    assert cmd, "the Dockerfile has a CMD in exec form"
    commands.append(Command("Dockerfile CMD", tuple(json.loads(cmd.group(1)))))
    for path in COMPOSE_FILES:
        for name, service in compose(path)["services"].items():
            argv = compose_argv(service)
            if argv is not None:
                commands.append(Command(f"{path.relative_to(DEPLOY)} {name}", tuple(argv)))
    for path, workload in workloads():
        for container in containers(workload):
            argv = kubernetes_argv(container)
            if argv is not None:
                where = f"{path.relative_to(DEPLOY)} {workload['metadata']['name']}/{container['name']}"
                commands.append(Command(where, tuple(argv)))
    commands += systemd_commands()
    for script in sorted(DEPLOY.rglob("*.sh")):
        commands += text_commands(script, script.read_text())
    for readme in sorted(DEPLOY.rglob("*.md")):
        commands += text_commands(readme, markdown_code(readme.read_text()))
    return commands


def child(element: ET.Element, tag: str) -> ET.Element:
    found = element.find(tag)
    assert found is not None, f"<{element.tag}> has no <{tag}>"
    return found


def cluster_config() -> tuple[ET.Element, ET.Element]:
    """The ClickHouse servers' config, and its one cluster."""
    server = ET.parse(CLICKHOUSE / "config.d" / "cluster.xml").getroot()
    (cluster,) = list(child(server, "remote_servers"))
    return server, cluster


def deploy_files() -> list[Path]:
    """Every file under deploy/ but the secrets make-secrets.sh writes."""
    return [
        path
        for path in sorted(DEPLOY.rglob("*"))
        if path.is_file() and "secrets" not in path.relative_to(DEPLOY).parts[:-1] and "__pycache__" not in path.parts
    ]


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yml", ".yaml", ".xml")),
    ids=lambda p: str(p.relative_to(DEPLOY)),
)
def test_config_files_parse(path: Path) -> None:
    if path.suffix == ".xml":
        assert ET.parse(path).getroot().tag == "clickhouse"
    else:
        assert all(isinstance(document, dict) for document in yaml.safe_load_all(path.read_text()))


def test_every_command_line_parses() -> None:
    commands = all_commands()
    sources = {command.where.split()[0] for command in commands}
    for expected in ("Dockerfile", "docker-compose.yml", "clickhouse/docker-compose.yml", "make-secrets.sh"):
        assert expected in sources, f"no tracehouse command line found in {expected}"
    assert any(s.startswith("kubernetes/") for s in sources) and any(s.startswith("systemd/") for s in sources)
    parser = build_parser()
    failures = [
        f"{command.where}: tracehouse {shlex.join(command.argv)}\n    {error}"
        for command in commands
        if (error := parse_error(parser, command.argv)) is not None
    ]
    assert not failures, "command lines the CLI does not take:\n" + "\n".join(failures)


def test_servers_beyond_loopback_have_tokens() -> None:
    for command in all_commands():
        if command.argv[0] == "serve" and not option(command.argv, "--listen")[0].startswith("127."):
            assert option(command.argv, "--tokens"), f"{command.where}: serve beyond loopback without --tokens"


def test_environment_variables_are_known() -> None:
    known = {value for value in vars(config).values() if isinstance(value, str) and value.startswith("TRACEHOUSE_")}
    used: dict[str, set[str]] = {}
    for path in deploy_files():
        for name in re.findall(r"(?<![A-Za-z0-9_])TRACEHOUSE_[A-Z0-9_]+", path.read_text()):
            used.setdefault(name, set()).add(str(path.relative_to(DEPLOY)))
    unknown = {name: sorted(files) for name, files in sorted(used.items()) if name not in known}
    assert not unknown, f"TRACEHOUSE_* variables that tracehouse/config.py does not define: {unknown}"


def test_clickhouse_cluster_layout() -> None:
    server, cluster = cluster_config()
    shards = cluster.findall("shard")
    assert [len(shard.findall("replica")) for shard in shards] == [2, 2]
    assert all(shard.findtext("internal_replication") == "true" for shard in shards)
    assert {macro.tag for macro in child(server, "macros")} == {"shard", "replica"}

    keeper = child(ET.parse(CLICKHOUSE / "keeper" / "keeper.xml").getroot(), "keeper_server")
    raft = {s.findtext("hostname"): s.findtext("id") for s in keeper.iter("server")}
    assert sorted(raft.values()) == ["1", "2", "3"]
    zookeeper = [(node.findtext("host"), node.findtext("port")) for node in server.iter("node")]
    assert zookeeper == [(host, keeper.findtext("tcp_port")) for host in raft]

    # the example cluster runs every node named in the config, each knowing its place
    services = compose(CLICKHOUSE / "docker-compose.yml")["services"]
    for number, shard in enumerate(shards, 1):
        for host in (replica.findtext("host") for replica in shard.findall("replica")):
            assert services[host]["hostname"] == host
            assert services[host]["environment"] == {"CLICKHOUSE_SHARD": str(number), "CLICKHOUSE_REPLICA": host}
    for host, server_id in raft.items():
        assert services[host]["environment"] == {"KEEPER_SERVER_ID": server_id}
    # what the XML takes from the environment is set there, or written by make-secrets.sh
    from_env = {
        element.get("from_env")
        for path in CLICKHOUSE.rglob("*.xml")
        for element in ET.parse(path).iter()
        if element.get("from_env")
    }
    set_by_compose = {name for service in services.values() for name in service.get("environment", {})}
    script = (DEPLOY / "make-secrets.sh").read_text()
    assert {name for name in from_env - set_by_compose if f"{name}=" not in script} == set()


def test_cluster_name_is_the_one_serve_is_given() -> None:
    _, cluster = cluster_config()
    given = {command.where: option(command.argv, "--cluster") for command in all_commands()}
    given = {where: names for where, names in given.items() if names}
    assert any(where.startswith("kubernetes/") for where in given)
    assert any(where.startswith("clickhouse/") for where in given)
    assert {where: names for where, names in given.items() if names != [cluster.tag]} == {}


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_compose_wiring(path: Path) -> None:
    project = compose(path)
    services = project["services"]
    listens = {
        name: port_of(option(argv, "--listen")[0])
        for name, service in services.items()
        if (argv := compose_argv(service)) and argv[0] == "serve"
    }
    health = healthcheck_parser()
    for name, service in services.items():
        assert set(service.get("secrets", [])) <= set(project.get("secrets", {})), name
        assert set(service.get("depends_on", [])) <= set(services), name
        argv = compose_argv(service) or []
        for secret in re.findall(r"/run/secrets/(\w+)", " ".join(argv)):
            assert secret in service.get("secrets", []), f"{name} reads /run/secrets/{secret}, not given it"
        for server in option(argv, "--server"):
            host, port = server.rsplit(":", 1)
            assert listens.get(host) == int(port), f"{name}: --server {server}, but serve listens on {listens}"
        test = service.get("healthcheck", {}).get("test", [])
        if "tracehouse-healthcheck" in test:
            check = test[test.index("tracehouse-healthcheck") + 1 :]
            assert parse_error(health, check) is None, f"{name}: {check}"
            own_port = listens.get(name) or int(option(argv, "--port")[0])
            assert port_of(check[1].removeprefix("http://")) == own_port, f"{name}: health check on another port"
        for published in service.get("ports", []):
            host_ip, *_, container_port = published.split(":")
            assert host_ip == "127.0.0.1", f"{name} is published beyond this machine: {published}"
            assert int(container_port) == int(option(argv, "--port")[0]), name


def test_make_secrets_writes_what_compose_mounts(tmp_path: Path) -> None:
    if not (shutil.which("python3", path="/usr/bin:/bin") or shutil.which("openssl", path="/usr/bin:/bin")):
        pytest.skip("make-secrets.sh needs python3 or openssl")
    copy = tmp_path / "deploy"
    copy.mkdir()
    shutil.copy(DEPLOY / "make-secrets.sh", copy)
    environment = {**os.environ, "PATH": "/usr/bin:/bin"}  # its own fallback, not `tracehouse token`
    for _ in range(2):  # a second run keeps what the first made
        subprocess.run(["sh", str(copy / "make-secrets.sh")], check=True, env=environment, capture_output=True)
    made = copy / "secrets"
    assert (made.stat().st_mode & 0o777) == 0o700
    lines = dict(line.split(" ", 1)[::-1] for line in (made / "tokens").read_text().splitlines())
    for scope in ("read", "write", "admin"):
        assert lines[(made / f"{scope}_token").read_text().strip()] == scope
        assert len((made / f"{scope}_token").read_text().strip()) >= 16
    for path in COMPOSE_FILES:
        project = compose(path)
        wanted = [secret["file"] for secret in project["secrets"].values()]
        wanted += [f for service in project["services"].values() for f in service.get("env_file", [])]
        for relative in wanted:
            written = copy / (path.parent / relative).resolve().relative_to(DEPLOY)
            assert written.is_file(), f"{path.name} wants {relative}, which make-secrets.sh does not write"
    assert "secrets/" in (DEPLOY / ".gitignore").read_text().split()


def example_secrets() -> dict[str, dict[str, str]]:
    """Secret name -> its keys and values, from secret.example.yaml."""
    return {
        document["metadata"]["name"]: {**document.get("data", {}), **document.get("stringData", {})}
        for document in yaml.safe_load_all((KUBERNETES / "secret.example.yaml").read_text())
    }


def listen_port(argv: list[str]) -> int:
    """Where a tracehouse process listens: serve's --listen, the explorer's --port."""
    return port_of(option(argv, "--listen")[0]) if argv[0] == "serve" else int(option(argv, "--port")[0])


def test_kubernetes_volumes_and_secrets() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    applied = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert set(kustomization["resources"]) == applied  # the example with placeholders is never applied
    secrets = example_secrets()
    for _, workload in workloads():
        name = workload["metadata"]["name"]
        template = workload["spec"]["template"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
        volumes = {volume["name"]: volume for volume in template["spec"]["volumes"]}
        for secret in (volume["secret"] for volume in volumes.values() if "secret" in volume):
            assert secret["secretName"] in secrets, f"{name}: Secret {secret['secretName']} is not in the example"
            for item in secret.get("items", []):
                assert item["key"] in secrets[secret["secretName"]], f"{name}: {secret['secretName']}/{item['key']}"
        for container in containers(workload):
            mounts = {mount["mountPath"]: mount["name"] for mount in container.get("volumeMounts", [])}
            assert set(mounts.values()) <= set(volumes), name
            defined = {item["name"] for item in container.get("env", [])}
            assert set(re.findall(r"\$\((\w+)\)", " ".join(container.get("args", [])))) <= defined, name
            for word in kubernetes_argv(container) or []:  # each file an option names is in a volume
                value = word.partition("=")[2] if word.startswith("--") else ""
                if value.startswith(("/etc/", "/var/")):
                    assert any(value.startswith(mount + "/") for mount in mounts), f"{name}: {word} is in no volume"


def test_kubernetes_ports() -> None:
    services = {doc["metadata"]["name"]: doc for _, doc in manifests() if doc["kind"] == "Service"}
    health = healthcheck_parser()
    for _, workload in workloads():
        for container in containers(workload):
            argv = kubernetes_argv(container) or []
            for server in option(argv, "--server"):  # clients name a Service and one of its ports
                host, port = server.rsplit(":", 1)
                ports = [p["port"] for p in services[host.split(".")[0]]["spec"]["ports"]]
                assert int(port) in ports, f"{workload['metadata']['name']}: --server {server}"
            for probe in ("readinessProbe", "livenessProbe"):
                command = container.get(probe, {}).get("exec", {}).get("command", [])
                if command:
                    assert command[0] == "tracehouse-healthcheck" and parse_error(health, command[1:]) is None
                    assert port_of(command[2]) == listen_port(argv), f"{workload['metadata']['name']} {probe}"
    for name, service in services.items():  # each Service reaches the port its pods' tracehouse listens on
        (workload,) = [
            w
            for _, w in workloads()
            if service["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        (container,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c.get("ports")]
        for port in service["spec"]["ports"]:
            targets = [p["containerPort"] for p in container["ports"] if port["targetPort"] in p.values()]
            assert targets == [listen_port(kubernetes_argv(container) or [])], f"{name}: {port} reaches {targets}"


def test_agent_daemonset_sees_the_host() -> None:
    (agent,) = [w for _, w in workloads() if w["kind"] == "DaemonSet"]
    spec = agent["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert spec["runtimeClassName"] == "nvidia"
    assert any(t.get("key") == "nvidia.com/gpu" for t in spec["tolerations"]) and spec["nodeSelector"]
    (container,) = spec["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})  # it takes no GPU from a job
    spool = option(kubernetes_argv(container) or [], "--spool")[0]
    (home,) = [v for v in spec["volumes"] if v.get("hostPath")]
    assert any(m["name"] == home["name"] and spool.startswith(m["mountPath"]) for m in container["volumeMounts"])


def test_example_tokens_match_the_clients() -> None:
    secrets = example_secrets()
    scopes = {token: scope for scope, token in map(str.split, secrets["tracehouse-tokens"]["tokens"].splitlines())}
    assert scopes[secrets["tracehouse-agent-token"]["token"]] == "write"
    assert scopes[secrets["tracehouse-ui-token"]["token"]] == "read"


def test_dockerfile() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.findall(r"^FROM (\S+)", text, re.MULTILINE) == ["python:3.11-slim", "python:3.11-slim"]
    assert re.search(r'^ENTRYPOINT \["tracehouse"\]$', text, re.MULTILINE)
    (user,) = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert not user.startswith(("0", "root"))
    for sources in re.findall(r"^COPY (?!--from)(?:--\S+ )*(.+) \S+$", text, re.MULTILINE):
        for source in sources.split():
            assert (REPO / source).exists(), f"the Dockerfile copies {source}, which is not in the repository"
