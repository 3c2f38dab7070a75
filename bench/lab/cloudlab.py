"""A one-host "cloud": ranks in network namespaces joined by veth pairs to a Linux bridge,
with injected loss (tc eBPF drop: random, in bursts or of small packets only), rate limits
(tbf), background allreduce traffic and stragglers. Needs root, iproute2 and (for loss) clang.

Everything a Lab creates is named with its prefix ``orl-<pid>-`` (namespaces) or
``orl<pid>`` (links while they are in the root namespace) and is removed by close(), which
runs on normal exit, on exceptions, on SIGINT/SIGTERM (see install_signal_handlers) and
at interpreter exit; ``cleanup_leftovers()`` removes anything a killed lab left behind, and
every new Lab first removes what labs of owners that no longer run left.

Topology (the bridge has its own namespace, so nothing touches the root namespace's
addresses or routes, and several labs can run at once):

    orl-<pid>-0 [eth0 10.201.0.1] --veth-- [p0] \
    orl-<pid>-1 [eth0 10.201.0.2] --veth-- [p1]  br0   (namespace orl-<pid>-br)
    ...                                        /
"""

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NS_PREFIX = "orl-"
LINK_PREFIX = "orl"
SUBNET = "10.201.0"
# Cloud VPCs carry jumbo frames between instances (AWS 9001, GCP up to 8896, Azure 9000 on
# accelerated networking); a 1500-byte lab would price kernel UDP at three times the syscalls
# and datagrams a cloud VM pays. TCP does not care (TSO/GRO move 64 KiB segments on veth).
DEFAULT_MTU = 9000


def run(cmd, check=True, **kw):
    """Runs a command (list); raises with its stderr when it fails and check is set."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if check and p.returncode != 0:
        raise RuntimeError("command failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr.strip()))
    return p


def namespaces():
    out = run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def root_links():
    out = run(["ip", "-o", "link", "show"], check=False).stdout
    names = []
    for line in out.splitlines():
        m = re.match(r"\d+: ([^:@]+)", line)
        if m:
            names.append(m.group(1))
    return names


def _kill_namespace_processes(ns):
    pids = run(["ip", "netns", "pids", ns], check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_leftovers(owner_pid=None, dead_owners_only=False):
    """Removes namespaces and root-namespace links of labs (all, or one owner's; with
    `dead_owners_only`, those whose owner process is gone: a lab killed by SIGKILL or a
    machine restart, which its own close() never ran for). Returns the names removed."""
    ns_pat = re.compile(r"^%s(\d+)-" % re.escape(NS_PREFIX))
    link_pat = re.compile(r"^%s(\d+)[ab]\d+$" % re.escape(LINK_PREFIX))

    def selected(owner):
        if owner_pid is not None and owner != owner_pid:
            return False
        return not dead_owners_only or not _alive(owner)

    removed = []
    for ns in namespaces():
        m = ns_pat.match(ns)
        if m and selected(int(m.group(1))):
            _kill_namespace_processes(ns)
            run(["ip", "netns", "del", ns], check=False)
            removed.append(ns)
    for link in root_links():
        m = link_pat.match(link)
        if m and selected(int(m.group(1))):
            run(["ip", "link", "del", link], check=False)
            removed.append(link)
    return removed


# The ack-path pattern's default size threshold (IPv4 total length, bytes). Every pure TCP
# ACK fits: 20 bytes of IP and at most 60 of TCP header with options (timestamps, SACK
# blocks). So does every ack datagram of our engine up to a 76-byte selective-ack bitmap:
# 20 (IP) + 8 (UDP) + 96 (our header, transport_dpdk/wire/wire_format.h) + bitmap, one bit per
# packet past the cumulative ack, i.e. a 4 MiB window of jumbo-frame packets (the lab's
# MTU) with room to spare. Our other control datagrams (RTS, credit, liveness: header
# only, 124 bytes) fit as well. Data packets are MTU-sized; only a message's last packet
# can be as small.
DEFAULT_ACK_MAX_LEN = 200
# The burst pattern's idle bound: a packet that arrives this long after its link's previous
# one meets the good state (drop.c explains why). Longer than the gaps between a busy
# flow's packets, shorter than any retransmission timeout.
BURST_IDLE_US = 1000
# The smallest threshold that can hold an IPv4 packet (a bare IPv4 header).
MIN_ACK_MAX_LEN = 20


class DropPattern:
    """How a link's injected loss falls on its packets (the drop probability P is given
    separately, per link):

      random          every IPv4 packet independently with probability P
      burst:B         Gilbert-Elliott: on average a share P of the packets, lost in runs
                      of B packets on average (B >= 1; P < B / (B + 1)); a run also ends
                      when the link has been idle for BURST_IDLE_US
      acks[:MAXLEN]   only packets of at most MAXLEN bytes (IPv4 total length, default
                      DEFAULT_ACK_MAX_LEN: pure ACKs and our acks), each with probability P
    """

    KINDS = ("random", "burst", "acks")

    def __init__(self, kind="random", burst_len=None, max_len=None):
        if kind not in self.KINDS:
            raise ValueError("drop pattern '%s' is not one of %s" % (kind, ", ".join(self.KINDS)))
        if kind == "burst":
            if burst_len is None or not 1 <= burst_len <= 1e6:
                raise ValueError("burst drop pattern: mean burst length must be in [1, 1e6] "
                                 "packets, got %r" % (burst_len,))
        elif burst_len is not None:
            raise ValueError("a burst length is only for the burst drop pattern")
        if kind == "acks":
            max_len = DEFAULT_ACK_MAX_LEN if max_len is None else max_len
            if not MIN_ACK_MAX_LEN <= max_len <= 65535:
                raise ValueError("acks drop pattern: MAXLEN must be %d..65535 bytes (IPv4 "
                                 "total length), got %r" % (MIN_ACK_MAX_LEN, max_len))
        elif max_len is not None:
            raise ValueError("a size threshold is only for the acks drop pattern")
        self.kind = kind
        self.burst_len = burst_len
        self.max_len = max_len

    @classmethod
    def parse(cls, text):
        """'random', 'burst:B' or 'acks[:MAXLEN]' -> DropPattern; ValueError naming the
        problem otherwise."""
        kind, colon, value = text.partition(":")
        if kind == "random":
            if colon:
                raise ValueError("drop pattern '%s': random takes no value" % text)
            return cls()
        if kind == "burst":
            if not value:
                raise ValueError("drop pattern '%s': give the mean burst length in packets, "
                                 "e.g. burst:8" % text)
            try:
                b = float(value)
            except ValueError:
                raise ValueError("drop pattern '%s': mean burst length '%s' is not a number"
                                 % (text, value))
            return cls("burst", burst_len=b)
        if kind == "acks":
            if not colon:
                return cls("acks")
            try:
                n = int(value)
            except ValueError:
                raise ValueError("drop pattern '%s': MAXLEN '%s' is not a whole number of "
                                 "bytes" % (text, value))
            return cls("acks", max_len=n)
        raise ValueError("drop pattern '%s': expected random, burst:B or acks[:MAXLEN]" % text)

    def check(self, prob):
        """Raises ValueError when this pattern cannot lose a share prob of the packets."""
        if not 0 <= prob <= 1:
            raise ValueError("drop probability must be in [0, 1], got %r" % prob)
        if self.kind == "burst" and prob > 0:
            # good->bad = P / (B (1 - P)) must be a probability.
            limit = self.burst_len / (self.burst_len + 1)
            if prob > limit:
                raise ValueError("burst drop pattern: with mean burst length %g the average "
                                 "loss must be at most B/(B+1) = %.4g, got %r" %
                                 (self.burst_len, limit, prob))

    def defines(self, prob):
        """The clang -D flags that build drop.c for this pattern at probability prob."""
        self.check(prob)
        ppm = int(round(prob * 1e6))
        if self.kind == "burst":
            good_to_bad = 0 if prob == 0 else prob / (self.burst_len * (1 - prob))
            return ["-DDROP_PATTERN=1",
                    "-DGOOD_TO_BAD_PPM=%d" % int(round(min(1.0, good_to_bad) * 1e6)),
                    "-DBAD_TO_GOOD_PPM=%d" % int(round(1e6 / self.burst_len)),
                    "-DBURST_IDLE_NS=%d" % (BURST_IDLE_US * 1000)]
        if self.kind == "acks":
            return ["-DDROP_PATTERN=2", "-DDROP_PPM=%d" % ppm, "-DMAX_LEN=%d" % self.max_len]
        return ["-DDROP_PATTERN=0", "-DDROP_PPM=%d" % ppm]

    def __str__(self):
        if self.kind == "burst":
            return "burst:%g" % self.burst_len
        if self.kind == "acks":
            return "acks:%d" % self.max_len
        return "random"


def _bpf_include_flags():
    flags = []
    for d in ("/usr/include/x86_64-linux-gnu", "/usr/include/aarch64-linux-gnu"):
        if os.path.isdir(os.path.join(d, "asm")):
            flags.append("-I" + d)
    return flags


class Lab:
    """N ranks in namespaces on one bridge. Use as a context manager."""

    def __init__(self, ranks, tag=None, mtu=DEFAULT_MTU, wire_segments=True, pin_cpus=False):
        if os.geteuid() != 0:
            raise PermissionError("the lab needs root (network namespaces, veth, tc)")
        if not 2 <= ranks <= 200:
            raise ValueError("ranks must be 2..200, got %d" % ranks)
        if not 1280 <= mtu <= 65535:
            raise ValueError("mtu must be 1280..65535, got %d" % mtu)
        self.ranks = ranks
        self.mtu = mtu
        self.wire_segments = wire_segments
        # pin_cpus: every process of rank r runs on one CPU, the (r mod n)-th of ours, as
        # if each rank had a CPU of its own host; otherwise the scheduler moves every thread
        # of every rank across all CPUs.
        self.cpus = sorted(os.sched_getaffinity(0)) if pin_cpus else None
        self.pid = os.getpid()
        self.tag = tag if tag is not None else "%d" % self.pid
        self.ns = ["%s%s-%d" % (NS_PREFIX, self.tag, i) for i in range(ranks)]
        self.bridge_ns = "%s%s-br" % (NS_PREFIX, self.tag)
        self.ips = ["%s.%d" % (SUBNET, i + 1) for i in range(ranks)]
        self.procs = []
        self.tmp = tempfile.mkdtemp(prefix="orl-lab-")
        self._closed = False
        self._bpf_objs = {}
        atexit.register(self.close)
        # What labs of processes that no longer exist left behind (their close() never
        # ran) goes first: every lab cleans up after the killed ones, so no run leaks.
        cleanup_leftovers(dead_owners_only=True)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # ---- topology -------------------------------------------------------------------
    def _build(self):
        run(["ip", "netns", "add", self.bridge_ns])
        self.ip_in(self.bridge_ns, ["link", "add", "br0", "type", "bridge"])
        self.ip_in(self.bridge_ns, ["link", "set", "br0", "up"])
        self.ip_in(self.bridge_ns, ["link", "set", "lo", "up"])
        for i, ns in enumerate(self.ns):
            run(["ip", "netns", "add", ns])
            a = "%s%sa%d" % (LINK_PREFIX, self.tag, i)
            b = "%s%sb%d" % (LINK_PREFIX, self.tag, i)
            # Create both ends directly inside their namespaces: nothing is ever left in
            # the root namespace, even if we are killed between two commands.
            run(["ip", "link", "add", a, "netns", ns, "type", "veth", "peer", "name", b,
                 "netns", self.bridge_ns])
            self.ip_in(ns, ["link", "set", a, "name", "eth0"])
            self.ip_in(self.bridge_ns, ["link", "set", b, "name", "p%d" % i])
            self.ip_in(ns, ["link", "set", "eth0", "mtu", str(self.mtu)])
            self.ip_in(self.bridge_ns, ["link", "set", "p%d" % i, "mtu", str(self.mtu)])
            if self.wire_segments:
                # One packet per frame towards the receiver, as on a cloud wire: the bridge
                # port segments TCP (TSO) and UDP (UDP_SEGMENT) bursts in software before
                # the rank's eth0, where --drop acts, so a drop loses one packet, not a
                # 64 KiB burst. Senders keep building 64 KiB bursts (a cloud vNIC's
                # segmentation offload). Measured: at 1% drop, 2 MB OptiReduce operations
                # lost whole 7-datagram bursts, went over the 5% loss limit and repaired
                # (p99 30.7 ms vs 10.6 per packet).
                self.ip_in(self.bridge_ns, ["link", "set", "p%d" % i, "gso_max_segs", "1"])
            self.ip_in(self.bridge_ns, ["link", "set", "p%d" % i, "master", "br0"])
            self.ip_in(self.bridge_ns, ["link", "set", "p%d" % i, "up"])
            self.ip_in(ns, ["addr", "add", "%s/24" % self.ips[i], "dev", "eth0"])
            self.ip_in(ns, ["link", "set", "eth0", "up"])
            self.ip_in(ns, ["link", "set", "lo", "up"])

    @staticmethod
    def ip_in(ns, args):
        return run(["ip", "-n", ns] + args)

    @staticmethod
    def tc_in(ns, args):
        return run(["ip", "netns", "exec", ns, "tc"] + args)

    def all_names(self):
        return self.ns + [self.bridge_ns]

    # ---- knobs ----------------------------------------------------------------------
    def _drop_obj(self, prob, pattern):
        defines = pattern.defines(prob)
        key = " ".join(defines)
        if key not in self._bpf_objs:
            obj = os.path.join(self.tmp, "drop_%d.o" % len(self._bpf_objs))
            # -g: the BTF that tc's libbpf loader needs to create the burst pattern's map.
            run(["clang", "-O2", "-g", "-target", "bpf"] + _bpf_include_flags() + defines +
                ["-c", os.path.join(HERE, "drop.c"), "-o", obj])
            self._bpf_objs[key] = obj
        return self._bpf_objs[key]

    def set_drop(self, rank, prob, direction="in", pattern=None):
        """Loss with probability `prob` on rank's link, distributed as `pattern` (a
        DropPattern; default random): 'in' (to the rank: single packets when
        wire_segments), 'out' (from the rank, before the bridge segments its bursts) or
        'both'. Each link gets its own program instance (and burst state)."""
        pattern = pattern or DropPattern()
        if direction not in ("in", "out", "both"):
            raise ValueError("direction must be in, out or both, got %r" % direction)
        obj = self._drop_obj(prob, pattern)
        targets = []
        if direction in ("in", "both"):
            targets.append((self.ns[rank], "eth0"))
        if direction in ("out", "both"):
            targets.append((self.bridge_ns, "p%d" % rank))
        for ns, dev in targets:
            self.tc_in(ns, ["qdisc", "replace", "dev", dev, "clsact"])
            self.tc_in(ns, ["filter", "replace", "dev", dev, "ingress", "prio", "1", "handle", "1",
                            "bpf", "da", "obj", obj, "sec", "drop"])

    def drop_counts(self):
        """(packets, dropped) summed over every link with a drop program: the packets that
        met the drop program (whatever its pattern) and those it lost, from the clsact
        qdiscs' counters (they count a dropped packet in both)."""
        packets = dropped = 0
        for ns in self.all_names():
            out = run(["ip", "netns", "exec", ns, "tc", "-s", "-j", "qdisc", "show"],
                      check=False).stdout
            for q in json.loads(out or "[]"):
                if q.get("kind") == "clsact":
                    packets += int(q.get("packets", 0))
                    dropped += int(q.get("drops", 0))
        return packets, dropped

    def set_rate(self, rank, rate, burst="64kb", latency="50ms", direction="both"):
        """tbf rate limit (e.g. '1gbit') on rank's link."""
        targets = []
        if direction in ("in", "both"):
            targets.append((self.bridge_ns, "p%d" % rank))  # bridge -> rank
        if direction in ("out", "both"):
            targets.append((self.ns[rank], "eth0"))  # rank -> bridge
        for ns, dev in targets:
            self.tc_in(ns, ["qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                            "burst", burst, "latency", latency])

    # ---- processes ------------------------------------------------------------------
    def cpu_of(self, rank):
        """The CPU rank's processes are pinned to, or None (not pinned)."""
        return self.cpus[rank % len(self.cpus)] if self.cpus else None

    def spawn(self, rank, cmd, stdout=None, stderr=None, env=None):
        """Starts cmd (list) in rank's namespace in its own process group (on its CPU
        when pinned)."""
        pin = [] if self.cpus is None else ["taskset", "-c", str(self.cpu_of(rank))]
        p = subprocess.Popen(["ip", "netns", "exec", self.ns[rank]] + pin + cmd, stdout=stdout,
                             stderr=stderr, start_new_session=True, env=env)
        self.procs.append(p)
        return p

    def kill(self, procs=None):
        procs = self.procs if procs is None else procs
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 3
        for p in procs:
            try:
                p.wait(max(0.05, deadline - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    def close(self):
        """Kills every process and removes every namespace, link and temp file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.kill()
        finally:
            for ns in self.all_names():
                if ns in namespaces():
                    _kill_namespace_processes(ns)
                    run(["ip", "netns", "del", ns], check=False)
            for link in root_links():
                if link.startswith("%s%sa" % (LINK_PREFIX, self.tag)) or \
                        link.startswith("%s%sb" % (LINK_PREFIX, self.tag)):
                    run(["ip", "link", "del", link], check=False)
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def install_signal_handlers():
    """SIGINT and SIGTERM unwind the stack (so every finally/with runs and tears down)."""
    def handler(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
