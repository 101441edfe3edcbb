package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/torpor/torpor/services/compute"
)

var _ compute.Dialer = (*Driver)(nil)

// netdev is the id of the guest's user-mode network backend on QEMU's
// command line, which hostfwd_add names.
const netdev = "n0"

// Dial connects to port of the sandbox's guest. The guest sits behind
// QEMU's user-mode network (slirp: no tap device, no bridge, no privilege
// on the host, and restrict=on keeps the guest from reaching the host or
// anything outside), which reaches a guest port only through a host
// forward: Dial adds one, from a free port of the host's loopback to the
// guest's port, the first time the port is asked for in this QEMU (HMP
// hostfwd_add through the driver's QMP monitor), and dials it; later Dials
// find it in QEMU (HMP info usernet) and dial it again. QEMU boots with no
// forward, and a restored QEMU is a new process with none: its first Dial
// adds it again, on whichever node restored it. Nothing of it is kept in
// the driver: a restarted driver finds the forwards in QEMU.
//
// slirp accepts the host side of a forwarded connection before the guest
// does, so a connection to a port nothing listens on in the guest would
// look connected until slirp closes it: Dial waits for the guest's answer
// (slirp's socket for the connection leaves SYN_SENT) and refuses the
// connection if the guest refused it. It does so under the sandbox's lock
// (the driver's monitor takes one client at a time): the dials of one
// sandbox connect one after the other, a few milliseconds each; their
// traffic flows in parallel.
func (d *Driver) Dial(ctx context.Context, spec compute.Spec, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("dial %s port %d: %w: no such port", spec.SandboxID, port, compute.ErrRejected)
	}
	c, err := d.dial(ctx, spec.SandboxID, port)
	if err != nil {
		return nil, fmt.Errorf("dial %s port %d: %w", spec.SandboxID, port, err)
	}
	return c, nil
}

// Unnetworked says why the guests have no network (the kernel's virtio-net
// modules are not where deploy/vm-kernel puts them, next to the kernel), or
// nil: Dial reaches their ports.
func (d *Driver) Unnetworked() error {
	if err := d.images.load(); err != nil {
		return err
	}
	if !d.images.net {
		return fmt.Errorf("%w: the guest has no network: no modules %s in %s (deploy/vm-kernel puts them next to the kernel)", compute.ErrRejected, strings.Join(netModules, ", "), d.images.modules)
	}
	return nil
}

func (d *Driver) dial(ctx context.Context, id string, port int) (net.Conn, error) {
	dir, st, unlock, err := d.open(id)
	defer unlock()
	if err != nil {
		return nil, err
	}
	if st == nil || !st.QEMU.Alive() {
		return nil, errors.New("no guest runs")
	}
	if err := d.Unnetworked(); err != nil {
		return nil, err
	}
	mo, err := dial(ctx, filepath.Join(dir, qmpSocket))
	if err != nil {
		return nil, err
	}
	defer mo.close()
	hp, err := mo.hostForward(port)
	if err != nil {
		return nil, err
	}
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(hp)))
	if err != nil {
		return nil, err
	}
	if err := mo.answered(ctx, st.QEMU.Pid, hp, c.(*net.TCPConn)); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// hostForward is the loopback port QEMU forwards to port of its guest,
// added if it has none yet.
func (mo *monitor) hostForward(port int) (int, error) {
	out, err := mo.hmp("info usernet")
	if err != nil {
		return 0, err
	}
	if hp, ok := forwardOf(out, port); ok {
		return hp, nil
	}
	// A free port now, which another process may take before QEMU binds it:
	// then hostfwd_add fails and another is tried.
	var last string
	for range 5 {
		hp, err := freePort()
		if err != nil {
			return 0, err
		}
		out, err := mo.hmp(fmt.Sprintf("hostfwd_add %s tcp:127.0.0.1:%d-:%d", netdev, hp, port))
		if err != nil {
			return 0, err
		}
		if last = strings.TrimSpace(out); last == "" {
			return hp, nil
		}
	}
	return 0, fmt.Errorf("hostfwd_add: %s", last)
}

// answered waits until the guest answered slirp's connection for c, which
// came in on forward port hp of QEMU qemu: slirp's socket for it (the one
// in QEMU whose peer is c's local port) is past SYN_SENT in HMP info
// usernet; or until slirp closed c: the guest refused it.
func (mo *monitor) answered(ctx context.Context, qemu, hp int, c *net.TCPConn) error {
	local := c.LocalAddr().(*net.TCPAddr).Port
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	for {
		state, err := mo.slirpState(qemu, hp, local)
		if err != nil {
			return err
		}
		if state != "" && state != "SYN_SENT" {
			return nil
		}
		// Closed and never seen past SYN_SENT: the guest refused it (or
		// accepted and closed it within a poll, which this cannot tell).
		if closed, err := peerClosed(raw); err != nil || closed {
			return errors.Join(errors.New("the guest refused the connection: nothing listens on the port"), err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the guest did not answer: %w", ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// peerClosed says whether the peer of the connection closed it (a read
// would end), without taking a byte of what it sent.
func peerClosed(raw syscall.RawConn) (bool, error) {
	var closed bool
	var rerr error
	err := raw.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case errors.Is(err, syscall.EAGAIN):
		case errors.Is(err, syscall.ECONNRESET):
			closed = true
		case err != nil:
			rerr = err
		case n == 0:
			closed = true
		}
		return true
	})
	return closed, errors.Join(err, rerr)
}

// slirpState is the TCP state slirp shows (HMP info usernet) for its side
// of the connection from local port local to forward port hp of QEMU qemu,
// or "" while it shows none (not accepted yet, or closed already). slirp's
// socket is found by its descriptor in QEMU: the socket whose peer is local.
func (mo *monitor) slirpState(qemu, hp, local int) (string, error) {
	ino, err := socketInode(hp, local)
	if err != nil || ino == "" {
		return "", err
	}
	out, err := mo.hmp("info usernet")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || !strings.HasPrefix(f[0], "TCP[") {
			continue
		}
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", qemu, f[1]))
		if err == nil && link == "socket:["+ino+"]" {
			return strings.TrimSuffix(strings.TrimPrefix(f[0], "TCP["), "]"), nil
		}
	}
	return "", nil
}

// socketInode is the inode of the IPv4 TCP socket of this network namespace
// (/proc/net/tcp) with local port local and peer port peer, or "".
func socketInode(local, peer int) (string, error) {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return "", err
	}
	lp, pp := fmt.Sprintf(":%04X", local), fmt.Sprintf(":%04X", peer)
	for _, l := range strings.Split(string(b), "\n") {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		f := strings.Fields(l)
		if len(f) >= 10 && strings.HasSuffix(f[1], lp) && strings.HasSuffix(f[2], pp) {
			return f[9], nil
		}
	}
	return "", nil
}

// hmp runs a command of QEMU's human monitor and returns what it printed.
func (mo *monitor) hmp(command string) (string, error) {
	out, err := mo.run("human-monitor-command", map[string]any{"command-line": command})
	if err != nil {
		return "", err
	}
	var s string
	if err := json.Unmarshal(out, &s); err != nil {
		return "", fmt.Errorf("qmp human-monitor-command %s: %w", command, err)
	}
	return s, nil
}

// forwardOf finds, in the output of HMP info usernet, the host port of a
// TCP host forward to guest port port.
func forwardOf(usernet string, port int) (int, bool) {
	for _, l := range strings.Split(usernet, "\n") {
		f := strings.Fields(l)
		// Protocol[State] FD Source-Address Port Dest.-Address Port RecvQ SendQ
		if len(f) < 6 || f[0] != "TCP[HOST_FORWARD]" {
			continue
		}
		hp, err1 := strconv.Atoi(f[3])
		gp, err2 := strconv.Atoi(f[5])
		if err1 == nil && err2 == nil && gp == port {
			return hp, true
		}
	}
	return 0, false
}

// freePort is a TCP port of the loopback nothing listens on now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
