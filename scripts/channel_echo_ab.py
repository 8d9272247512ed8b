"""The channel's framing, A/B: asyncio streams (a reader task woken per frame: what
trialbox/cluster/channel.py used before session 12) against asyncio.Protocols parsing
frames in data_received (what it uses now). Two processes on loopback, a ~700-byte call
echoed back, 4 in flight, 6,000 calls after 500 of warm-up; CPU per call of the caller
(os.times) and of the serving process (its children's times, warm-up included). Run the
variants alternately in one go to compare on the same machine state. Not a test.

    .venv/bin/python scripts/channel_echo_ab.py streams proto streams proto
"""
import asyncio, os, pickle, struct, sys, time, socket
L = struct.Struct(">I")
PAY = (1, "bench", {"task_id": "HumanEval/0", "completion": "x" * 600}, None)
N = 6000
def cpu(): t = os.times(); return t.user + t.system
async def server_streams(port_w):
    async def serve(r, w):
        async def ans(rid, args):
            await asyncio.sleep(0)
            body = pickle.dumps((rid, True, args), 5); w.write(L.pack(len(body)) + body)
        while True:
            try:
                h = await r.readexactly(4)
            except Exception: return
            (n,) = L.unpack(h); rid, args = pickle.loads(await r.readexactly(n))
            asyncio.get_running_loop().create_task(ans(rid, args))
    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    os.write(port_w, str(srv.sockets[0].getsockname()[1]).encode()); os.close(port_w)
    await asyncio.sleep(1e9)
class SP(asyncio.Protocol):
    def connection_made(self, t): self.t = t; self.buf = bytearray(); t.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    def data_received(self, d):
        self.buf += d
        while len(self.buf) >= 4:
            (n,) = L.unpack_from(self.buf)
            if len(self.buf) < 4 + n: break
            rid, args = pickle.loads(memoryview(self.buf)[4:4 + n]); del self.buf[:4 + n]
            asyncio.get_running_loop().create_task(self.ans(rid, args))
    async def ans(self, rid, args):
        await asyncio.sleep(0)
        body = pickle.dumps((rid, True, args), 5); self.t.write(L.pack(len(body)) + body)
async def server_proto(port_w):
    srv = await asyncio.get_running_loop().create_server(SP, "127.0.0.1", 0)
    os.write(port_w, str(srv.sockets[0].getsockname()[1]).encode()); os.close(port_w)
    await asyncio.sleep(1e9)
class CP(asyncio.Protocol):
    def __init__(self): self.buf = bytearray(); self.pending = {}
    def connection_made(self, t): self.t = t; t.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    def data_received(self, d):
        self.buf += d
        while len(self.buf) >= 4:
            (n,) = L.unpack_from(self.buf)
            if len(self.buf) < 4 + n: break
            rid, ok, v = pickle.loads(memoryview(self.buf)[4:4 + n]); del self.buf[:4 + n]
            f = self.pending.pop(rid, None)
            if f and not f.done(): f.set_result(v)
async def client(port, mode):
    loop = asyncio.get_running_loop()
    if mode == "streams":
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pending = {}
        async def rd():
            while True:
                (n,) = L.unpack(await r.readexactly(4)); rid, ok, v = pickle.loads(await r.readexactly(n))
                f = pending.pop(rid, None)
                if f and not f.done(): f.set_result(v)
        loop.create_task(rd())
        send = lambda b: w.write(b)
    else:
        t, p = await loop.create_connection(CP, "127.0.0.1", port); pending = p.pending
        send = lambda b: t.write(b)
    ids = iter(range(1, 10**9))
    async def call():
        rid = next(ids); f = loop.create_future(); pending[rid] = f
        body = pickle.dumps((rid, PAY), 5); send(L.pack(len(body)) + body)
        return await f
    sem = asyncio.Semaphore(4)
    async def one():
        async with sem: await call()
    await asyncio.gather(*(one() for _ in range(500)))
    c0, t0 = cpu(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(N)))
    return (cpu() - c0) / N * 1e6, N / (time.perf_counter() - t0)
for mode in sys.argv[1:]:
    r, w = os.pipe(); pid = os.fork()
    if pid == 0:
        os.close(r); asyncio.run(server_streams(w) if mode == "streams" else server_proto(w)); os._exit(0)
    os.close(w); port = int(os.read(r, 100)); os.close(r)
    t0 = os.times()
    c, rate = asyncio.run(client(port, mode))
    os.kill(pid, 9); os.waitpid(pid, 0); t1 = os.times()
    print(f"{mode}: client {c:.1f} us CPU/call, {rate:.0f} calls/s, server total {(t1.children_user + t1.children_system - t0.children_user - t0.children_system) / (N + 500) * 1e6:.1f} us CPU/call (incl. warm-up)")
