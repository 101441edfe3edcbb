package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// forwardTo opens a forward to port of sandbox id on the service at
// httpAddr; an error says why it was not opened.
func forwardTo(httpAddr, id string, port int) (events.Forward, error) {
	resp, err := http.Post("http://"+httpAddr+"/v1/sandboxes/"+id+"/forwards", "application/json",
		strings.NewReader(fmt.Sprintf(`{"listen":"127.0.0.1:0","port":%d}`, port)))
	if err != nil {
		return events.Forward{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		body, _ := io.ReadAll(resp.Body)
		return events.Forward{}, fmt.Errorf("open forward: %d %s", resp.StatusCode, body)
	}
	var fw events.Forward
	err = json.NewDecoder(resp.Body).Decode(&fw)
	return fw, err
}

// TestWakeOnTrafficVM: a vm sandbox serving HTTP with busybox httpd in its
// guest, created with wake_on_traffic, is reached through a forward
// (the vm driver's Dial: a host forward of QEMU's user-mode network);
// suspended, a client's request through the forward wakes it (one resume,
// its actor the forward) and gets the restored guest's answer.
func TestWakeOnTrafficVM(t *testing.T) {
	kernel := vmKernel(t)
	dir := t.TempDir()
	t.Cleanup(func() { deleteVMSandboxes(t, dir) })
	c := serveProcess(t, dir, "--vm-kernel", kernel)
	cl := c.client()
	ctx := context.Background()
	v, err := cl.Create(ctx, torpor.CreateRequest{Driver: "vm", WakeOnTraffic: true, Command: []string{"sh", "-c",
		"echo woken > /index.html; exec httpd -f -p 8080 -h /"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	// A TCG boot takes seconds, more on a busy machine.
	if got, err := cl.Wait(ctx, v.ID, events.PhaseReady, 3*time.Minute); err != nil || got.Phase != events.PhaseReady {
		t.Fatalf("the VM sandbox is not ready: %+v, %v", got, err)
	}
	// httpd listens a moment after the guest is ready; a forward opens
	// once something listens on its port.
	var fw events.Forward
	eventually(t, "a forward to the guest's port 8080", func() bool {
		fw, err = forwardTo(c.http, v.ID, 8080)
		return err == nil
	})
	if got, err := through(t, fw.Address); err != nil || got != "woken\n" {
		t.Fatalf("through the forward of the running sandbox: %q, %v", got, err)
	}
	lifecycleTo(t, cl, "suspend", v.ID, events.PhaseSuspended)
	if got, err := through(t, fw.Address); err != nil || got != "woken\n" {
		t.Fatalf("through the forward of the suspended sandbox: %q, %v", got, err)
	}
	rs := resumes(t, cl, v.ID)
	if len(rs) != 1 || rs[0].Actor != "forward:"+fw.ID {
		t.Fatalf("resumes in the history: %+v, want one by forward:%s", rs, fw.ID)
	}
	if got, _ := cl.Get(ctx, v.ID); got.Phase != events.PhaseReady || got.Generation != 2 {
		t.Fatalf("after the wake: %s generation %d, want ready generation 2", got.Phase, got.Generation)
	}
}
