package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/drivertest"
	"github.com/torpor/torpor/services/compute/remote"
)

// driverProcess is `torpor driver` running as a process of its own.
type driverProcess struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // of Wait, once done is closed
}

// startDriver runs `torpor driver` with args and waits until it says its
// drivers are served. It is killed at cleanup if it still runs.
func startDriver(t *testing.T, args ...string) *driverProcess {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"driver"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &driverProcess{cmd: cmd, done: make(chan struct{})}
	up := make(chan struct{})
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "torpor driver is up: ") {
				close(up)
			}
			if testing.Verbose() {
				t.Log("driver: " + sc.Text())
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		p.err = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	select {
	case <-up:
	case <-p.done:
		t.Fatalf("torpor driver exited before it was up: %v", p.err)
	case <-time.After(waitFor):
		t.Fatal("torpor driver did not come up")
	}
	return p
}

// TestDriverVerbServesASimSandbox: `torpor driver` serves its node's sim
// on the bus; a remote.Client starts a sandbox there (its supervisor
// reports to the gateway), observes it running, stops it; SIGTERM ends
// the verb cleanly and leaves the node unserved.
func TestDriverVerbServesASimSandbox(t *testing.T) {
	g := drivertest.NewGateway(t)
	p := startDriver(t, "--node", "n1", "--drivers", "sim,process", "--nats-url", g.URL, "--data", t.TempDir(), "--heartbeat", "1s")
	nc, err := nats.Connect(g.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	c := remote.NewClient(nc, "n1", "sim")
	spec := compute.Spec{SandboxID: "sb1", Node: "n1"}
	if err := c.Start(ctx, compute.Start{Spec: spec, Generation: 1, Credential: drivertest.Cred(1)}); err != nil {
		t.Fatalf("start: %v", err)
	}
	if r := g.Await(t, spec.SandboxID, compute.ReportAttached, 1); r.Credential != drivertest.Cred(1) {
		t.Fatalf("attach %+v", r)
	}
	if o, err := c.Observe(ctx, spec); err != nil || o.State != compute.StateRunning || o.Generation != 1 {
		t.Fatalf("observe after the start: %+v, %v", o, err)
	}
	if err := c.Stop(ctx, compute.Target{Spec: spec, Generation: 1}); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if o, err := c.Observe(ctx, spec); err != nil || o.State != compute.StateStopped {
		t.Fatalf("observe after the stop: %+v, %v", o, err)
	}
	if caps := remote.NewClient(nc, "n1", "process").Capabilities(nil); !caps.Suspend {
		t.Fatalf("capabilities of the process driver: %+v", caps)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
		if p.err != nil {
			t.Fatalf("torpor driver ended by SIGTERM: %v", p.err)
		}
	case <-time.After(waitFor):
		t.Fatal("torpor driver did not end on SIGTERM")
	}
	if _, err := c.Observe(ctx, spec); !errors.Is(err, compute.ErrUnavailable) || !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("observe once the driver ended: %v, want no responders", err)
	}
}

// TestDriverVerbFlagsRefused: `torpor driver` refuses bad flags with
// INVALID_ARGUMENT naming the flag (both flags for --vm-kernel without vm in
// --drivers), and a driver it cannot build yet with
// UNIMPLEMENTED; nothing is served.
func TestDriverVerbFlagsRefused(t *testing.T) {
	srv := natstest.StartWith(t, natstest.Options{Listen: true})
	url, dir := srv.ClientURL(), t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--node", "Bad.Node", "--nats-url", url, "--data", dir}, "INVALID_ARGUMENT: --node"},
		{[]string{"--nats-url", url, "--data", dir}, "INVALID_ARGUMENT: --node"},
		{[]string{"--node", "n1", "--data", dir}, "INVALID_ARGUMENT: --nats-url"},
		{[]string{"--node", "n1", "--nats-url", url}, "INVALID_ARGUMENT: --data"},
		{[]string{"--node", "n1", "--nats-url", url, "--data", dir, "--drivers", "sim,nope"}, "INVALID_ARGUMENT: --drivers"},
		{[]string{"--node", "n1", "--nats-url", url, "--data", dir, "--drivers", "sim,sim"}, "INVALID_ARGUMENT: --drivers"},
		{[]string{"--node", "n1", "--nats-url", url, "--data", dir, "--drivers", ""}, "INVALID_ARGUMENT: --drivers"},
		{[]string{"--node", "n1", "--nats-url", url, "--data", dir, "--heartbeat", "0s"}, "INVALID_ARGUMENT: --heartbeat"},
		{[]string{"--node", "n1", "--nats-url", url, "--data", dir, "extra"}, "INVALID_ARGUMENT: "},
		{[]string{"--node", "n1", "--nats-url", url, "--data", dir, "--run-as", "no-such-user-torpor"}, "INVALID_ARGUMENT: --run-as: run as \"no-such-user-torpor\": unknown user"},
		{[]string{"--node", "n1", "--nats-url", url, "--data", dir, "--drivers", "sim", "--vm-kernel", "/k"}, "INVALID_ARGUMENT: --vm-kernel /k without vm in --drivers (sim)"},
		{[]string{"--node", "n1", "--nats-url", url, "--data", dir, "--vm-kernel", "/k"}, "INVALID_ARGUMENT: --vm-kernel /k without vm in --drivers (sim,process)"},
		{[]string{"--node", "n1", "--nats-url", url, "--data", dir, "--drivers", "sim,vm", "--vm-kernel", "/nowhere"}, "FAILED_PRECONDITION: the vm driver cannot run here: missing the guest kernel"},
	} {
		var out, errb bytes.Buffer
		// A combination let through would serve until the context ends.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		code := run(ctx, append([]string{"driver"}, tc.args...), &out, &errb)
		cancel()
		// The exit statuses of the CLI's table (README): 2 INVALID_ARGUMENT,
		// 4 FAILED_PRECONDITION.
		want := 2
		if strings.HasPrefix(tc.want, "FAILED_PRECONDITION") {
			want = 4
		}
		if code != want || !strings.HasPrefix(errb.String(), "torpor: "+tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", tc.args, code, errb.String(), tc.want)
		}
	}
	if _, err := remote.NewClient(srv.Conn, "n1", "sim").Observe(context.Background(), compute.Spec{SandboxID: "sb1"}); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("observe after the refusals: %v, want no responders", err)
	}
}
