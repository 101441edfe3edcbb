package remote_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/remote"
)

// awaiter is the fake with an ExportAwaiter: it answers via and bytes for
// ref "r1", nothing for any other.
type awaiter struct {
	fake
	via   string
	bytes int64
}

func (a *awaiter) AwaitExport(ctx context.Context, spec compute.Spec, ref string) (string, int64, error) {
	if ref != "r1" {
		return "", 0, nil
	}
	return a.via, a.bytes, nil
}

// TestRemoteAwaitExport (issue 29): the wait for an export ahead crosses
// the bus with the object's reference and size; a driver that exports
// nothing ahead answers UNIMPLEMENTED, through Routed too.
func TestRemoteAwaitExport(t *testing.T) {
	srv := natstest.Start(t)
	serve(t, srv.Connect(t), "n1", compute.Registry{"vm": &awaiter{via: "vmobj:sb1/snap:abc", bytes: 1 << 27}, "fake": &fake{}})
	s := spec("sb1", nil)
	routed := &compute.Routed{Local: "n0", Here: &fake{}, There: func(n string) compute.Driver { return remote.NewClient(srv.Conn, n, "vm") }}
	for _, c := range []struct {
		name  string
		d     compute.ExportAwaiter
		ref   string
		via   string
		bytes int64
	}{
		{"exported", remote.NewClient(srv.Conn, "n1", "vm"), "r1", "vmobj:sb1/snap:abc", 1 << 27},
		{"none", remote.NewClient(srv.Conn, "n1", "vm"), "r2", "", 0},
		{"routed", routed, "r1", "vmobj:sb1/snap:abc", 1 << 27},
	} {
		via, n, err := c.d.AwaitExport(ctx(t), s, c.ref)
		if err != nil || via != c.via || n != c.bytes {
			t.Errorf("%s: %q, %d, %v; want %q, %d", c.name, via, n, err, c.via, c.bytes)
		}
	}
	_, _, err := remote.NewClient(srv.Conn, "n1", "fake").AwaitExport(ctx(t), s, "r1")
	if !errors.Is(err, compute.ErrUnimplemented) || events.CodeOf(err) != events.CodeUnimplemented {
		t.Errorf("a driver that exports nothing ahead: %v (%s), want UNIMPLEMENTED", err, events.CodeOf(err))
	}
	here := &compute.Routed{Local: "n0", Here: &fake{}}
	own := compute.Spec{SandboxID: "sb1", Node: "n0"}
	if _, _, err := here.AwaitExport(ctx(t), own, "r1"); !errors.Is(err, compute.ErrUnimplemented) {
		t.Errorf("routed here to a driver that exports nothing ahead: %v, want UNIMPLEMENTED", err)
	}
}

// slowExport is an ExportAwaiter whose export finishes when released; it
// says on entered each time it is asked.
type slowExport struct {
	fake
	entered chan struct{}
	release chan struct{}
}

func (a *slowExport) AwaitExport(ctx context.Context, spec compute.Spec, ref string) (string, int64, error) {
	a.entered <- struct{}{}
	select {
	case <-a.release:
		return "obj:" + ref, 9, nil
	case <-ctx.Done():
		return "", 0, ctx.Err()
	}
}

// TestRemoteAwaitExportLongerThanACall (issue 29): an export that takes
// longer than one call waits (the node answers UNAVAILABLE when the call's
// time is up) is asked for again until it finished, within the caller's
// context.
func TestRemoteAwaitExportLongerThanACall(t *testing.T) {
	srv := natstest.Start(t)
	slow := &slowExport{entered: make(chan struct{}, 8), release: make(chan struct{})}
	serve(t, srv.Connect(t), "n1", compute.Registry{"vm": slow})
	c := remote.NewClient(srv.Conn, "n1", "vm", remote.WithOpTimeout(remote.OpAwaitExport, 100*time.Millisecond))
	type answer struct {
		via string
		n   int64
		err error
	}
	got := make(chan answer, 1)
	go func() {
		via, n, err := c.AwaitExport(ctx(t), spec("sb1", nil), "r1")
		got <- answer{via, n, err}
	}()
	for i := range 2 { // the second once the first call's time was up
		select {
		case <-slow.entered:
		case a := <-got:
			t.Fatalf("call %d: the wait ended before the export finished: %q, %d, %v", i+1, a.via, a.n, a.err)
		case <-time.After(10 * time.Second):
			t.Fatalf("call %d never came", i+1)
		}
	}
	close(slow.release)
	if a := <-got; a.err != nil || a.via != "obj:r1" || a.n != 9 {
		t.Fatalf("an export longer than a call: %q, %d, %v; want obj:r1, 9", a.via, a.n, a.err)
	}
	short, cancel := context.WithTimeout(ctx(t), 300*time.Millisecond)
	defer cancel()
	held := &slowExport{entered: make(chan struct{}, 8), release: make(chan struct{})}
	serve(t, srv.Connect(t), "n2", compute.Registry{"vm": held})
	c = remote.NewClient(srv.Conn, "n2", "vm", remote.WithOpTimeout(remote.OpAwaitExport, 100*time.Millisecond))
	if _, _, err := c.AwaitExport(short, compute.Spec{SandboxID: "sb1", Node: "n2"}, "r1"); !errors.Is(err, compute.ErrUnavailable) {
		t.Fatalf("an export that never finishes: %v, want UNAVAILABLE once the caller's context ends", err)
	}
}
