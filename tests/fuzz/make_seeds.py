#!/usr/bin/python3
"""Writes the seed corpora of tests/fuzz (run once; the files are committed).

  /usr/bin/python3 tests/fuzz/make_seeds.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def datagram(type_, flags=0, token=0x1234, src=1, dst=0, ctx=1, seq=0, msg=0, slot=0,
             offset=0, total=0, ack=0, aux=0, payload=b""):
    head = struct.pack("<IBBHQIIIIQQQQQQQII", 0x5044524F, 1, type_, flags, token, src, dst,
                       ctx, len(payload), seq, msg, slot, offset, total, ack, aux, 0, 0)
    assert len(head) == 96
    crc = crc32c(head + payload)
    return head[:88] + struct.pack("<I", crc) + head[92:] + payload


def write(folder, name, data):
    path = os.path.join(HERE, "corpus", folder)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# wire_format: one of each packet type, plus near misses.
write("wire_format", "data_eager", datagram(1, 1, offset=0, total=64, payload=bytes(range(64))))
write("wire_format", "data_rdv_mid", datagram(1, 0, offset=1000, total=4096, seq=7, msg=3,
                                             payload=b"\xab" * 512))
write("wire_format", "rts", datagram(2, total=1 << 20, slot=5, msg=2))
write("wire_format", "cts", datagram(3, msg=2))
write("wire_format", "ack_sack", datagram(4, ack=10, payload=b"\x05\x00\xff\x01"))
write("wire_format", "credit", datagram(5, aux=65536))
write("wire_format", "bounded_last", datagram(1, 4 | 8, offset=128, total=256, msg=9,
                                             payload=b"\x11" * 128))
write("wire_format", "repair", datagram(7, 4, msg=9, payload=struct.pack("<QQ", 0, 128)))
write("wire_format", "repair_ranges", datagram(7, 4, msg=9, payload=struct.pack(
    "<QQQQQQ", 0, 128, 64, 64, 1 << 40, (1 << 40) + 9000)))
write("wire_format", "ping", datagram(8, msg=3))
write("wire_format", "pong", datagram(9, msg=3))
write("wire_format", "abort", datagram(10, aux=3))
write("wire_format", "ping_with_payload", datagram(8, payload=b"\0" * 8))
write("wire_format", "bad_bounds", datagram(1, 1, offset=32, total=64, payload=b"\0" * 64))
write("wire_format", "short", b"ORDP\x01")

# bounded_receiver: [staging u16][history u8][nregions u8][(peer u8, size u16)...] steps.
def regions(specs):
    out = struct.pack("<HBB", 4000, 2, len(specs) - 1)
    for peer, n in specs:
        out += struct.pack("<BH", peer, n)
    return out


def post(op):
    return bytes([(op << 4) | 0])


def close(op):
    return bytes([(op << 4) | 1])


def data(op, src, offset, length, last=False, wild=False):
    shape = (4 if last else 0) | (1 if wild else 0)
    out = bytes([(op << 4) | 2, (src + 1) % 7, shape]) + struct.pack("<H", offset & 0xFFFF)
    if wild:
        out += struct.pack("<Q", offset)
    return out + struct.pack("<H", length)


two = regions([(1, 1000), (2, 1000)])
write("bounded_receiver", "in_order", two + post(0) + data(0, 1, 0, 500) + data(0, 1, 500, 500, True)
      + data(0, 2, 0, 1000, True) + close(0))
write("bounded_receiver", "staged_then_post", two + data(1, 1, 200, 300) + data(1, 2, 0, 1000)
      + post(1) + data(1, 1, 0, 200) + data(1, 1, 500, 500, True))
write("bounded_receiver", "overlaps", two + post(2) + data(2, 1, 100, 400) + data(2, 1, 0, 150)
      + data(2, 1, 450, 100) + data(2, 1, 300, 700) + data(2, 1, 0, 1000))
write("bounded_receiver", "out_of_bounds", two + post(3) + data(3, 1, 900, 200)
      + data(3, 2, 2**64 - 10, 20, wild=True) + data(3, 4, 0, 10) + data(3, 0, 0, 0, True))
write("bounded_receiver", "stale_after_close", two + post(0) + data(0, 1, 0, 100) + close(0)
      + data(0, 1, 100, 100) + post(4) + close(4) + data(4, 2, 0, 10) + post(0))
write("bounded_receiver", "staging_overflow", two + b"".join(data(op, 1, 0, 2000) for op in range(5))
      + post(5))

# config: "NAME=value" lines ("#k"/"@k" name documented variable k / its alias).
write("config", "empty", "")
write("config", "optireduce", "GLOO_ALGO=optireduce\nOPTIREDUCE_TIMEOUT_MS=250\n"
      "OPTIREDUCE_MAX_LOSS=0.05\nOPTIREDUCE_HADAMARD=on\n")
write("config", "udp", "GLOO_ALGO=Transpose\nOPTIREDUCE_UDP_PORT_BASE=20000\n"
      "OPTIREDUCE_FAULTS=drop=0.01,dup=0.01,seed=3\nOPTIREDUCE_SESSION_TOKEN=42\n")
write("config", "redis", "OPTIREDUCE_REDIS_URL=redis://user:s3cretpassw0rd@localhost:6380/2\n"
      "OPTIREDUCE_RUN_ID=job7\n")
write("config", "redis_bad_port", "OPTIREDUCE_REDIS_URL=redis://:s3cretpassw0rd@host:99999\n")
write("config", "aliases", "@1=100\n#1=100\n#2=yes\n@3=x\n#20=1\nGLOO_DPDK_FOO=1\n")
write("config", "bad_values", "GLOO_ALGO=bcube\n")

# redis_url
for name, url in [("full", "redis://user:p%40ss%3Aword@redis.example:6380/3"),
                  ("password_only", "redis://:hunter2hunter2@10.0.0.1"),
                  ("lone_userinfo", "redis://s3cretpassw0rd@host/1"),
                  ("bad_port", "redis://:s3cretpassw0rd@host:notaport"),
                  ("bad_scheme", "http://host:6379"),
                  ("bad_escape", "redis://u:%zzsecretsecret@host"),
                  ("ipv6ish", "redis://[::1]:6379/0")]:
    write("redis_url", name, url)

# receive_window: 2-byte steps, sequence numbers relative to the cumulative point + 256
def steps(rels):
    return b"".join(struct.pack("<H", r + 256) for r in rels)


write("receive_window", "in_order", steps([0] * 64))
write("receive_window", "reversed", steps(list(range(63, -1, -1))))
write("receive_window", "gaps_and_duplicates", steps([5, 3, 5, 0, -1, 1, 0, 9, 2, 300, 1]))
write("receive_window", "window_edge", steps([8191, 8192, 10000, 0, 8190, -200, 4096]))

# send_scoreboard: operations (first byte % 7) with their operands; see the target.
def send(k, size=100):
    return bytes([0, k - 1] + [size - 1] * k)


def ack(r, sack=b""):  # cum = base + r - 1
    return bytes([1, r, len(sack)]) + sack


write("send_scoreboard", "send_then_ack", send(16) + ack(9) + ack(17))
write("send_scoreboard", "sack_runs", send(16) + send(16) + ack(3, bytes([0b10110110, 0xff, 0x0f, 0x80])) +
      ack(3, bytes([0xff, 0xff])) + ack(33))
write("send_scoreboard", "rto_restore", send(10) + bytes([3, 2, 4, 5, 5, 2, 7]) + ack(3) +
      bytes([6]) + ack(12))
write("send_scoreboard", "bad_acks", send(4) + ack(0) + ack(6) + ack(5, bytes([0xff] * 30)))
