"""Memory of mcpyard held by calls whose upstream answers in one-byte chunks.

Usage: python3 perf/one-byte-chunks.py BINARY CALLS TEXT_BYTES

Starts BINARY (1 worker, epoll) in front of an upstream of its own that answers every
`tools/call` with a result of TEXT_BYTES characters sent as chunks of one byte each
(`1\r\nx\r\n`), opens one session and CALLS calls on connections with a 4 KiB receive
buffer that are never read, so every call's answer backs up in the gateway. After 6 s it
prints the gateway's resident memory (VmRSS) before the calls and with them stuck, and its
peak (VmHWM). Standard library only; ports are picked at run time.
"""
import json, os, socket, subprocess, sys, tempfile, threading, time

BIN, K, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def upstream():
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0)); ls.listen(1024)
    def serve(c):
        f = c.makefile("rb")
        while True:
            length = 0
            while True:
                line = f.readline()
                if not line: return
                if line == b"\r\n": break
                if line.lower().startswith(b"content-length:"): length = int(line.split(b":")[1])
            body = f.read(length); req = json.loads(body)
            if req.get("method") == "initialize":
                js = json.dumps({"jsonrpc":"2.0","id":req["id"],"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"u","version":"1"}}}).encode()
                c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: s1\r\ncontent-length: %d\r\n\r\n" % len(js) + js)
            elif "id" not in req:
                c.sendall(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
            else:
                js = json.dumps({"jsonrpc":"2.0","id":req["id"],"result":{"content":[{"type":"text","text":"q"*T}]}}).encode()
                out = bytearray(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
                for b in js: out += b"1\r\n" + bytes([b]) + b"\r\n"
                out += b"0\r\n\r\n"
                try: c.sendall(out)
                except OSError: return
    def loop():
        while True:
            c, _ = ls.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()
    return ls.getsockname()[1]

up = upstream()
cfg = os.path.join(tempfile.mkdtemp(prefix="mcpyard-onebyte-"), "gateway.yaml")
open(cfg, "w").write(f"""runtime: {{workers: 1, io: epoll}}
bindings:
  north: {{kind: server, listen: 127.0.0.1:0, path: /mcp, exit: exit}}
  exit: {{kind: client, server: "http://127.0.0.1:{up}/mcp"}}
""")
gw = subprocess.Popen([BIN, "--config", cfg], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
port = None
for line in gw.stdout:
    if line.startswith("listening north"):
        port = int(line.strip().rsplit(":", 1)[1]); break
threading.Thread(target=lambda: [None for _ in gw.stdout], daemon=True).start()
def post(s, sid, body):
    h = f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\n"
    if sid: h += f"mcp-session-id: {sid}\r\n"
    s.sendall((h + f"content-length: {len(body)}\r\n\r\n").encode() + body.encode())
s = socket.create_connection(("127.0.0.1", port))
post(s, None, json.dumps({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"m","version":"1"}}}))
head = s.recv(65536).decode(errors="replace")
sid = [l.split(":",1)[1].strip() for l in head.split("\r\n") if l.lower().startswith("mcp-session-id")][0]
def status():
    d = dict(l.split(":",1) for l in open(f"/proc/{gw.pid}/status"))
    return int(d["VmRSS"].split()[0]), int(d["VmHWM"].split()[0])
base = status()
conns = []
for i in range(K):
    c = socket.socket(); c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.connect(("127.0.0.1", port))
    post(c, sid, json.dumps({"jsonrpc":"2.0","id":100+i,"method":"tools/call","params":{"name":"x","arguments":{}}}))
    conns.append(c)
time.sleep(6)
rss, hwm = status()
print(f"{BIN}: K={K} T={T}: RSS before {base[0]} kB, with the calls stuck {rss} kB, peak {hwm} kB")
gw.kill()
