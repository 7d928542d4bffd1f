"""Replays a fleet's batches (tracehouse/bench/payloads.py) over many gRPC channels from one asyncio loop,
as agents' shippers send them: one batch in flight per writer, in order, each sent again as the same
bytes after RESOURCE_EXHAUSTED (as long as the server's hint asks), UNAVAILABLE or a deadline, since the
server stores a batch written twice once. And `sink`: a server that takes writes and drops them, for the
generator's own ceiling."""

from __future__ import annotations

import asyncio
import itertools
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from agent.shipping.shipper import PERMANENT, UNHINTED_PUSHBACK_S, pushback_seconds
from tracehouse.bench.payloads import FleetBatches
from tracehouse.pushback import TRANSPORT_MAX_BYTES
from tracehouse.v1 import ingest_pb2

WRITE = "/tracehouse.v1.Ingest/Write"
CALL_TIMEOUT_S = 30.0
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.1, 1.0
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", TRANSPORT_MAX_BYTES),
    ("grpc.max_receive_message_length", TRANSPORT_MAX_BYTES),
    ("grpc.use_local_subchannel_pool", 1),  # a connection per channel, not one shared by all
    ("grpc.initial_reconnect_backoff_ms", 100),  # back within a second of a restarted server
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


@dataclass
class Delivery:
    writer: int
    k: int
    values: int
    due_s: float  # when the batch closed, from the start
    acked_s: float | None = None
    refused: str = ""  # the status of a refusal that no retry can change
    duplicate: bool = False  # the server answered that it had stored the batch before
    sent_s: float = 0.0  # when its last call began
    calling: bool = False  # a call is under way (not a pause the server asked for, nor a backoff)


@dataclass
class Tally:
    calls: int = 0
    resource_exhausted: int = 0
    unavailable: int = 0
    deadline_exceeded: int = 0
    refused: int = 0
    other_errors: dict[str, int] = field(default_factory=dict)  # by status
    first_error: str = ""  # the first answer of those, for the person reading the report


@dataclass
class Replay:
    deliveries: list[Delivery] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)
    finished_s: float = 0.0  # when the last writer finished or was given up, from the start


def replay(
    batches: FleetBatches,
    address: str,
    seconds: float,
    channels: int,
    base_ns: int,
    *,
    paced: bool = True,
    drain_s: float = 60.0,
    hooks: Sequence[tuple[float, Callable[[], None]]] = (),
) -> Replay:
    """Every writer's batches due within `seconds` of the start, each when due (`paced`), or (not
    `paced`) as fast as each writer's answers come, until `seconds`. Writers still sending `drain_s`
    after `seconds` are given up. `hooks` run at their second of the run, in this thread."""
    return asyncio.run(_Replayer(batches, address, seconds, channels, base_ns, paced).run(drain_s, hooks))


class _Replayer:
    def __init__(
        self, batches: FleetBatches, address: str, seconds: float, channels: int, base_ns: int, paced: bool
    ) -> None:
        self.batches, self.address, self.seconds, self.channels = batches, address, seconds, channels
        self.base_ns, self.paced = base_ns, paced
        self.result = Replay()
        self.t0 = 0.0

    def now(self) -> float:
        return asyncio.get_running_loop().time() - self.t0

    async def run(self, drain_s: float, hooks: Sequence[tuple[float, Callable[[], None]]]) -> Replay:
        opened = [grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS) for _ in range(self.channels)]
        answer = ingest_pb2.WriteResponse.FromString
        writes = [channel.unary_unary(WRITE, response_deserializer=answer) for channel in opened]  # sends bytes
        self.t0 = asyncio.get_running_loop().time()
        timers = [asyncio.create_task(self._at(at, hook)) for at, hook in hooks]
        writers = [asyncio.create_task(self._writer(w, writes[w % len(writes)])) for w in range(self.batches.writers)]
        _, late = await asyncio.wait(writers, timeout=self.seconds + drain_s)
        for task in late:
            task.cancel()
        self.result.finished_s = self.now()
        await asyncio.gather(*late, return_exceptions=True)
        await asyncio.gather(*timers)
        for channel in opened:
            await channel.close()
        return self.result

    async def _at(self, at: float, hook: Callable[[], None]) -> None:
        await asyncio.sleep(max(0.0, at - self.now()))
        hook()

    async def _writer(self, writer: int, write: grpc.aio.UnaryUnaryMultiCallable) -> None:
        for k in itertools.count():
            due = self.batches.due_s(writer, k) if self.paced else self.now()
            if due >= self.seconds:
                return
            await asyncio.sleep(due - self.now())
            delivery = Delivery(writer, k, self.batches.values(writer, k), due)
            self.result.deliveries.append(delivery)
            await self._deliver(write, self.batches.payload(self.base_ns, writer, k), delivery)

    async def _deliver(self, write: grpc.aio.UnaryUnaryMultiCallable, payload: bytes, delivery: Delivery) -> None:
        tally, backoff = self.result.tally, FIRST_BACKOFF_S
        while True:
            tally.calls += 1
            delivery.sent_s, delivery.calling = self.now(), True
            try:
                answer = await write(payload, timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                delivery.calling = False
                code = error.code()
                if code in PERMANENT:
                    tally.refused += 1
                    delivery.refused = code.name
                    return
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    tally.resource_exhausted += 1
                    await asyncio.sleep(_pushback_s(error) * (1 + 0.5 * random.random()))
                    continue
                if code == grpc.StatusCode.UNAVAILABLE:
                    tally.unavailable += 1
                elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    tally.deadline_exceeded += 1
                else:
                    tally.other_errors[code.name] = tally.other_errors.get(code.name, 0) + 1
                    tally.first_error = tally.first_error or f"{code.name}: {error.details()}"
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(MAX_BACKOFF_S, 2 * backoff)
                continue
            delivery.acked_s, delivery.duplicate, delivery.calling = self.now(), answer.duplicate, False
            return


def _pushback_s(error: grpc.aio.AioRpcError) -> float:
    """The pause a RESOURCE_EXHAUSTED answer asks for, as the agent reads it; 1 s without a usable hint."""
    asked = pushback_seconds(error)
    return UNHINTED_PUSHBACK_S if asked is None else asked


def sink() -> None:
    """A Write server that answers every call at once and keeps nothing: `python -c` runs it as a child
    of the bench; it says where it listens on stderr, as `tracehouse serve` does."""

    async def drop(data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return b""

    async def serve() -> None:
        server = grpc.aio.server(options=CHANNEL_OPTIONS[:2])
        handler = grpc.unary_unary_rpc_method_handler(drop)
        service = grpc.method_handlers_generic_handler("tracehouse.v1.Ingest", {"Write": handler})
        server.add_generic_rpc_handlers((service,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(f"listening on 127.0.0.1:{port}", file=sys.stderr, flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())
