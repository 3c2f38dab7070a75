"""One rank of a two-rank torch.distributed job (our UDP device) that a forged ICMP "port
unreachable" must not kill.

Run by test_peer_death.py:  forged_icmp_worker.py RANK WORLD INIT_METHOD OUT_JSON PORT0 PORT1
Rank r binds 127.0.0.1:PORTr (the test sets OPTIREDUCE_UDP_PORT_BASE per rank). After a
barrier rank 1 waits in dist.recv from rank 0 while rank 0 computes for 3 s; meanwhile rank 0
(root: a raw socket, as any host that knows the two ports could) sends three ICMP port
unreachable messages to 127.0.0.1 that quote a UDP datagram from rank 1's port to rank 0's,
then sends. Each rank writes {"ok", "error", "forged"}.
"""

import json
import socket
import struct
import sys
import time

rank, world, init_method, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
port0, port1 = int(sys.argv[5]), int(sys.argv[6])
import optireduce  # noqa: F401  (must precede torch)

import datetime

import torch
import torch.distributed as dist


def checksum(data):
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def forge(quoted_payload):
    """ICMP port unreachable quoting 127.0.0.1:port1 -> 127.0.0.1:port0 (UDP)."""
    lo = socket.inet_aton("127.0.0.1")
    udp = struct.pack("!HHHH", port1, port0, 8 + len(quoted_payload), 0) + quoted_payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, socket.IPPROTO_UDP, 0,
                     lo, lo)
    ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
    body = ip + udp
    icmp = struct.pack("!BBHI", 3, 3, 0, 0) + body
    icmp = icmp[:2] + struct.pack("!H", checksum(icmp)) + icmp[4:]
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as s:
        s.sendto(icmp, ("127.0.0.1", 0))


dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
result = {"ok": False, "error": "", "forged": 0}
try:
    dist.barrier()
    if rank == 0:
        # A guess at our header: magic "ORDP", version 1, PING, a made-up token, ranks 1 -> 0.
        guessed = struct.pack("<IBBHQIII", 0x5044524F, 1, 8, 0, 0x0123456789ABCDEF, 1, 0, 0)
        guessed += b"\0" * (96 - len(guessed))
        for quoted in (b"", guessed, b""):
            time.sleep(0.5)  # computing
            forge(quoted)
            result["forged"] += 1
        time.sleep(1.5)  # computing
        dist.send(torch.full((4096,), 7.0), 1)
    else:
        t = torch.zeros(4096)
        dist.recv(t, 0)
        assert bool((t == 7.0).all()), "received wrong data"
    dist.barrier()
    result["ok"] = True
except Exception as e:  # noqa: BLE001  (reported to the test)
    result["error"] = "%s: %s" % (type(e).__name__, e)
with open(out_path, "w") as f:
    json.dump(result, f)
sys.stdout.flush()
import os  # noqa: E402

os._exit(0)  # a failed process group cannot be destroyed cleanly
