"""An HTTP/3 client for tests/http3.rs on aioquic (an implementation independent of the quinn
and h3 crates the gateway is built on), driven sans-IO over one UDP socket so that a test can
also replay what it sent.

Reads a JSON job on stdin:
  {"host": "127.0.0.1", "port": 443, "server_name": "localhost", "ca": "/path/ca.pem",
   "requests": [{"method": "GET", "path": "/x", "headers": [["k", "v"]], "body": "text",
                 "trailers": [["k", "v"]]}],   # trailers: sent after the body (optional)
   "ticket_in": "/path" | null,   # resume with this session ticket (0-RTT if it allows)
   "ticket_out": "/path" | null,  # keep the session ticket the server sends
   "early": false,                # send the requests before the handshake completes (0-RTT)
   "replay": 0,                   # then send the first flight again N times, from new sockets
                                  # that never answer (a replayed or spoofed Initial + 0-RTT)
   "spoof": 0,                    # first send N first flights (new connections) from N sockets
                                  # that never answer: N handshakes left in progress
   "flight_only": false,          # send the first flight and stop (an address that never
                                  # answers), printing the packet types that came back
   "client_cert": "/path", "client_key": "/path",  # a client certificate (mTLS)
   "bind": "127.0.0.1",           # the client's address (any 127/8 address on Linux)
   "migrate_to": "127.0.0.2",     # then move the connection to a socket on this address
   "after_migration": [...],      # and send these requests from there
   "timeout": 10}
Prints one JSON object: {"responses": [{"status", "headers", "body", "trailers", "reset"}],
"early_data_accepted", "session_resumed", "first_packets": [...]}.
"""

import base64
import json
import os
import pickle
import socket
import sys
import time

from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import HandshakeCompleted, StreamReset


def packet_type(data):
    """The long header packet type of a datagram's first packet (or "short")."""
    if not data or not data[0] & 0x80:
        return "short"
    return ["initial", "0rtt", "handshake", "retry"][(data[0] & 0x30) >> 4]


def main():
    job = json.load(sys.stdin)
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    cfg.server_name = job.get("server_name", "localhost")
    cfg.load_verify_locations(job["ca"])
    if job.get("client_cert"):
        cfg.load_cert_chain(job["client_cert"], job["client_key"])
    if job.get("ticket_in"):
        with open(job["ticket_in"], "rb") as f:
            cfg.session_ticket = pickle.load(f)
    tickets = []
    addr = (job["host"], job["port"])
    spoofed = []
    for _ in range(job.get("spoof", 0)):
        c = QuicConnection(configuration=cfg)
        c.connect(addr, now=time.time())
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        for data, to in c.datagrams_to_send(now=time.time()):
            s.sendto(data, to)
        spoofed.append(s)
    time.sleep(0.3 if spoofed else 0)
    conn = QuicConnection(configuration=cfg, session_ticket_handler=tickets.append)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((job.get("bind", "127.0.0.1"), 0))
    conn.connect(addr, now=time.time())
    h3 = H3Connection(conn)
    deadline = time.time() + job.get("timeout", 10)
    state = {"complete": False, "early_data_accepted": False, "session_resumed": False}
    results = {}
    order = []
    flight = []

    def send(record):
        for data, to in conn.datagrams_to_send(now=time.time()):
            sock.sendto(data, to)
            if record:
                flight.append(data)

    def request(r):
        sid = conn.get_next_available_stream_id()
        body = r.get("body")
        body = body.encode() if body is not None else None
        headers = [
            (b":method", r["method"].encode()),
            (b":scheme", b"https"),
            (b":authority", r.get("authority", cfg.server_name).encode()),
            (b":path", r["path"].encode()),
        ] + [(k.lower().encode(), v.encode()) for k, v in r.get("headers", [])]
        trailers = [(k.lower().encode(), v.encode()) for k, v in r.get("trailers", [])]
        h3.send_headers(sid, headers, end_stream=not body and not trailers)
        if body:
            h3.send_data(sid, body, end_stream=not trailers)
        if trailers:
            # The request's trailer section: a HEADERS frame after the body, ending the stream.
            h3.send_headers(sid, trailers, end_stream=True)
        results[sid] = {"status": None, "headers": [], "body": b"", "trailers": [], "reset": None}
        order.append(sid)
        return sid

    def handle_events():
        while True:
            ev = conn.next_event()
            if ev is None:
                return
            if isinstance(ev, HandshakeCompleted):
                state["complete"] = True
                state["early_data_accepted"] = ev.early_data_accepted
                state["session_resumed"] = ev.session_resumed
            if isinstance(ev, StreamReset) and ev.stream_id in results:
                results[ev.stream_id]["reset"] = ev.error_code
                results[ev.stream_id]["done"] = True
            for hev in h3.handle_event(ev):
                r = results.get(getattr(hev, "stream_id", None))
                if r is None:
                    continue
                if isinstance(hev, HeadersReceived):
                    fields = [(k.decode(), v.decode()) for k, v in hev.headers]
                    if r["status"] is None:
                        r["status"] = int(dict(fields)[":status"])
                        r["headers"] = [f for f in fields if not f[0].startswith(":")]
                    else:
                        r["trailers"] = fields
                elif isinstance(hev, DataReceived):
                    r["body"] += hev.data
                if getattr(hev, "stream_ended", False):
                    r["done"] = True

    def pump(until):
        while not until():
            send(False)
            now = time.time()
            if now > deadline:
                sys.stderr.write("h3client: timed out; state %r results %r\n" % (state, results))
                raise SystemExit(2)
            timer = conn.get_timer()
            wait = deadline - now if timer is None else min(deadline, timer) - now
            sock.settimeout(max(wait, 0.001))
            try:
                data, frm = sock.recvfrom(65536)
                conn.receive_datagram(data, frm, now=time.time())
            except socket.timeout:
                if timer is not None and time.time() >= timer:
                    conn.handle_timer(now=time.time())
            handle_events()

    if job.get("early") or job.get("flight_only"):
        for r in job["requests"]:
            request(r)
    send(True)

    if job.get("flight_only"):
        # An address that never answers: see what the server sends back, answer nothing.
        seen = []
        sock.settimeout(1.0)
        try:
            while True:
                data, _ = sock.recvfrom(65536)
                seen.append(packet_type(data))
        except socket.timeout:
            pass
        print(json.dumps({"responses": [], "first_packets": seen}))
        return

    pump(lambda: state["complete"])
    if not job.get("early"):
        for r in job["requests"]:
            request(r)
    pump(lambda: all(results[s].get("done") for s in order))
    if job.get("migrate_to"):
        # Connection migration: the same connection from another address (as a client moving
        # networks); the server validates the new path.
        old = sock
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((job["migrate_to"], 0))
        old.close()
        for r in job.get("after_migration", []):
            request(r)
        pump(lambda: all(results[s].get("done") for s in order))
    # The session ticket comes after the handshake: wait a little for it when asked.
    if job.get("ticket_out"):
        pump_until = time.time() + 2
        deadline = max(deadline, pump_until + 1)
        pump(lambda: tickets or time.time() > pump_until)
        if tickets:
            with open(job["ticket_out"], "wb") as f:
                pickle.dump(tickets[-1], f)
    conn.close()
    send(False)

    for _ in range(job.get("replay", 0)):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        for data in flight:
            s.sendto(data, addr)
        time.sleep(0.2)
        s.close()

    out = {
        "responses": [
            {
                "status": results[s]["status"],
                "headers": results[s]["headers"],
                "body": results[s]["body"].decode("utf-8", "replace"),
                "body_b64": base64.b64encode(results[s]["body"]).decode(),
                "trailers": results[s]["trailers"],
                "reset": results[s]["reset"],
            }
            for s in order
        ],
        "early_data_accepted": state["early_data_accepted"],
        "session_resumed": state["session_resumed"],
        "got_ticket": bool(tickets),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
