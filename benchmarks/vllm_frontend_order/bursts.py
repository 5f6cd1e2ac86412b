"""BURSTS bursts of N simultaneous streamed completions (one per connection), each after the last
ended: per request its send, response headers, first token and end (CLOCK_MONOTONIC)."""
import asyncio
import json
import random
import sys
import time

HOST, PORT, OUT = "127.0.0.1", int(sys.argv[1]), sys.argv[2]  # then BURSTS GEN PROMPT [N]
K, GEN, PROMPT = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
N = int(sys.argv[6]) if len(sys.argv) > 6 else 32
rng = random.Random(1)
recs = []

def body(i):
    b = {"model": "m", "prompt": [rng.randrange(10, 4000) for _ in range(PROMPT)],
         "max_tokens": GEN, "min_tokens": GEN, "ignore_eos": True, "temperature": 0.0,
         "stream": True, "stream_options": {"include_usage": True}}
    raw = json.dumps(b, separators=(",", ":")).encode()
    return (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"x-idx: {i}\r\nContent-Length: {len(raw)}\r\n\r\n").encode() + raw

async def one(r, w, i, payload):
    t_sent = time.monotonic()
    w.write(payload)
    first = None
    while True:
        line = await r.readline()
        if line.strip() == b"":
            continue
        if line.startswith(b"HTTP/"):
            hdr = time.monotonic()
            while (await r.readline()) not in (b"\r\n", b""):
                pass
            continue
        size = int(line.strip(), 16)
        if size == 0:
            await r.readline()
            break
        data = await r.readexactly(size + 2)
        if first is None and b'"text"' in data:
            first = time.monotonic()
    recs.append({"i": i, "sent": t_sent, "hdr": hdr, "first": first, "end": time.monotonic()})

async def main():
    conns = [await asyncio.open_connection(HOST, PORT) for _ in range(N)]
    for k in range(K):
        payloads = [body(k * N + j) for j in range(N)]
        await asyncio.gather(*(one(conns[j][0], conns[j][1], k * N + j, payloads[j])
                               for j in range(N)))
        await asyncio.sleep(0.5 if N > 1 else 0.05)


asyncio.run(main())
with open(OUT, "w") as f:
    json.dump(recs, f)
