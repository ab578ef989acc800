"""Two "hosts" on one machine: two network namespaces joined by a veth pair, each with its own private address.

msrun cannot run two nodes on 127.0.0.1 (both launchers see the master address as local and both start a
scheduler); in two namespaces only the one owning the master address starts it, as on two real machines. Every
name carries this process's id, so concurrent runs do not collide, and everything is removed on exit, also after a
failure. Traffic cannot leave the namespaces: they hold only their loopback and their end of the veth pair.
"""
import os
import shutil
import signal
import subprocess
import sys

SUBNET = "10.231.0"  # private; lives only inside the two namespaces, so it cannot clash with the host's networks
MASTER_PORT = 8240  # free in a fresh namespace


def _ip(*args, check=True):
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"'ip {' '.join(args)}' failed ({result.returncode}): {result.stderr.strip()}")
    return result


def unavailable_reason():
    """Why two namespaces cannot be made here (a one-line reason), or None when they can."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    if shutil.which("ip") is None:
        return "the 'ip' command (iproute2) is not installed"
    probe = f"msaprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"'ip netns add' failed: {made.stderr.strip().splitlines()[0] if made.stderr.strip() else 'no reason'}"
    _ip("netns", "del", probe, check=False)
    return None


class TwoHosts:
    """Namespaces `msa<pid><tag>n0` (SUBNET.1, the master) and `msa<pid><tag>n1` (SUBNET.2); a context manager.

    `tag` (at most 3 characters: link names have at most 15) tells apart two pairs made by one process.
    `launch(node, argv)` starts `argv` inside node's namespace in its own process group.
    """

    def __init__(self, tag=""):
        if len(tag) > 3:
            raise ValueError(f"For 'TwoHosts', 'tag' must have at most 3 characters, but got {tag!r}.")
        tag = f"msa{os.getpid()}{tag}"
        self.namespaces = (f"{tag}n0", f"{tag}n1")
        self.addresses = (f"{SUBNET}.1", f"{SUBNET}.2")
        self._links = (f"{tag}v0", f"{tag}v1")

    def __enter__(self):
        try:
            for ns in self.namespaces:
                _ip("netns", "add", ns)
            _ip("link", "add", self._links[0], "type", "veth", "peer", "name", self._links[1])
            for ns, link, address in zip(self.namespaces, self._links, self.addresses):
                _ip("link", "set", link, "netns", ns)
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", link)
                _ip("-n", ns, "link", "set", link, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc):
        self.remove()

    def remove(self):
        """Delete both namespaces (which deletes the veth pair) and a link left in the root namespace."""
        for ns in self.namespaces:
            _ip("netns", "del", ns, check=False)
        if _ip("link", "show", self._links[0], check=False).returncode == 0:
            _ip("link", "del", self._links[0], check=False)

    def leftovers(self):
        """This object's namespaces still present, and its links still in this (the root) namespace."""
        listed = _ip("netns", "list", check=False).stdout.split()
        present = [ns for ns in self.namespaces if ns in listed]
        present += [link for link in self._links if _ip("link", "show", link, check=False).returncode == 0]
        return present

    def launch(self, node, argv, env=None, **popen_kwargs):
        return subprocess.Popen(["ip", "netns", "exec", self.namespaces[node], *argv], env=env,
                                start_new_session=True, **popen_kwargs)


def stop(process):
    """Kill a launched process group that is still running."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
