package vm_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/drivertest"
	"github.com/torpor/torpor/services/compute/vm"
)

// webServer serves a page naming the guest on port 8080 with busybox httpd.
var webServer = []string{"sh", "-c", "mkdir -p /www && echo hello from the guest > /www/index.html && exec httpd -f -p 8080 -h /www"}

// probingWebServer first tries to reach port $HOSTPORT of the host (the
// user-mode network's 10.0.2.2 is the host's loopback unless restricted)
// and says on its console whether it did, then serves as webServer.
var probingWebServer = []string{"sh", "-c", "if nc -w 3 10.0.2.2 $HOSTPORT </dev/null; then echo host reached; else echo host unreachable; fi; " + webServer[2]}

// get asks port 8080 of s's guest, through d's Dial, for its page.
func get(ctx context.Context, d *vm.Driver, s compute.Spec) (string, error) {
	c, err := d.Dial(ctx, s, 8080)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := fmt.Fprint(c, "GET /index.html HTTP/1.0\r\n\r\n"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(bufio.NewReader(c))
	return string(b), err
}

// TestDial: one guest serving HTTP on port 8080 is reached through Dial,
// and it could not reach the host (restrict=on);
// a port nothing listens on in it is refused; after a suspend and a resume
// (a new QEMU, with none of the old one's forwards) it is reached again;
// and after it moved to another node, through that node's driver.
func TestDial(t *testing.T) {
	g := drivertest.NewGateway(t)
	n1, _ := newDriver(t, g, nil)
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := host.Accept(); err == nil {
			accepted <- struct{}{}
			c.Close()
		}
	}()
	s := spec("n1", probingWebServer...)
	s.Env = map[string]string{"HOSTPORT": strconv.Itoa(host.Addr().(*net.TCPAddr).Port)}
	start(t, n1, g, s, 1)
	const want = "hello from the guest"
	// httpd listens a moment after the guest said it is ready.
	reached := func(t *testing.T, d *vm.Driver, s compute.Spec) {
		t.Helper()
		var got string
		var err error
		eventually(t, "the guest's page through Dial", func() bool {
			c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			got, err = get(c, d, s)
			return err == nil && strings.Contains(got, want)
		})
		if !strings.HasPrefix(got, "HTTP/1.") {
			t.Fatalf("got %q, %v; want an HTTP answer with %q", got, err, want)
		}
	}
	t.Run("reached", func(t *testing.T) { reached(t, n1, s) })
	t.Run("the host is not reached from the guest", func(t *testing.T) {
		b, err := n1.Logs(ctx(t), s, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "host unreachable") {
			t.Fatalf("the guest's console: %q, want host unreachable", b)
		}
		select {
		case <-accepted:
			t.Fatal("the guest connected to the host's loopback")
		default:
		}
	})
	t.Run("again, on the same forward", func(t *testing.T) {
		for range 3 {
			got, err := get(ctx(t), n1, s)
			if err != nil || !strings.Contains(got, want) {
				t.Fatalf("got %q, %v; want %q", got, err, want)
			}
		}
		un, err := vm.UserNet(ctx(t), n1, s)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(un, "HOST_FORWARD"); n != 1 {
			t.Fatalf("QEMU has %d host forwards after 4 dials of one port, want 1:\n%s", n, un)
		}
	})
	t.Run("nothing listens", func(t *testing.T) {
		c, err := n1.Dial(ctx(t), s, 8081)
		if err == nil {
			c.Close()
			t.Fatal("a dial of port 8081, where nothing listens in the guest, connected")
		}
		if !strings.Contains(err.Error(), "refused") {
			t.Fatalf("a dial of port 8081, where nothing listens: %v; want it refused", err)
		}
	})
	t.Run("after suspend and resume", func(t *testing.T) {
		ref, err := n1.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
		if err != nil {
			t.Fatal(err)
		}
		if c, err := n1.Dial(ctx(t), s, 8080); err == nil {
			c.Close()
			t.Fatal("the suspended guest was dialled")
		}
		if res, err := n1.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, Credential: drivertest.Cred(2), RestoreRef: ref}); err != nil || !res.Consumed {
			t.Fatalf("resume: %+v, %v", res, err)
		}
		g.Await(t, s.SandboxID, compute.ReportAttached, 2)
		reached(t, n1, s)
	})
	t.Run("on another node", func(t *testing.T) {
		n2, _ := newDriver(t, g, nil)
		ref, err := n1.Suspend(ctx(t), compute.Target{Spec: s, Generation: 2})
		if err != nil {
			t.Fatal(err)
		}
		moved, err := n1.Export(ctx(t), s, ref)
		if err != nil {
			t.Fatal(err)
		}
		s2 := s
		s2.Node = "n2"
		if res, err := n2.Resume(ctx(t), compute.Resume{Spec: s2, Generation: 3, Credential: drivertest.Cred(3), RestoreRef: moved}); err != nil || !res.Consumed {
			t.Fatalf("resume on n2: %+v, %v", res, err)
		}
		g.Await(t, s.SandboxID, compute.ReportAttached, 3)
		if err := n1.Discard(ctx(t), s, ref); err != nil {
			t.Fatal(err)
		}
		reached(t, n2, s2)
		if c, err := n1.Dial(ctx(t), s, 8080); err == nil {
			c.Close()
			t.Fatal("n1, which holds nothing of the sandbox now, dialled it")
		}
	})
}

// TestUnnetworked: a kernel without the network modules next to it (where
// deploy/vm-kernel puts them) makes guests without a network, which the
// driver says; with them all there, it says nothing.
func TestUnnetworked(t *testing.T) {
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("SKIPPED, NOT PASSED: no /bin/busybox")
	}
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz-6.1.0-test")
	if err := os.WriteFile(kernel, []byte("a kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(kernel, filepath.Join(dir, "vmlinuz")); err != nil {
		t.Fatal(err)
	}
	driver := func() *vm.Driver {
		d, err := vm.New(vm.Config{Data: t.TempDir(), NATSURL: "nats://127.0.0.1:1", Kernel: filepath.Join(dir, "vmlinuz")})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if err := driver().Unnetworked(); err == nil || !strings.Contains(err.Error(), "no network") {
		t.Fatalf("no modules: %v, want the guest has no network", err)
	}
	mods := filepath.Join(dir, "modules-6.1.0-test")
	if err := os.Mkdir(mods, 0o755); err != nil {
		t.Fatal(err)
	}
	names := []string{"virtio_ring", "virtio", "virtio_mmio", "failover", "net_failover", "virtio_net"}
	for _, m := range names[:5] {
		if err := os.WriteFile(filepath.Join(mods, m+".ko"), []byte("a module"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := driver().Unnetworked(); err == nil {
		t.Fatal("without virtio_net.ko: no error, want the guest has no network")
	}
	if err := os.WriteFile(filepath.Join(mods, "virtio_net.ko"), []byte("a module"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := driver().Unnetworked(); err != nil {
		t.Fatalf("with every module: %v", err)
	}
}
