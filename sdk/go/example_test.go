package torpor_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	torpor "github.com/torpor/torpor/sdk/go"
)

// A sandbox created, suspended and resumed over HTTP. Each command answers
// the view as it left the sandbox (the transient phase); Wait waits for
// the outcome.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := torpor.New(server.http, nil).WithToken(server.token) // e.g. "127.0.0.1:8080", and the secret of serve's <data>/admin.token

	v, err := c.Create(ctx, torpor.CreateRequest{Driver: "sim"}, "")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("created:", v.Phase)
	if v, err = c.Wait(ctx, v.ID, torpor.PhaseReady, 0); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("then:", v.Phase)

	if v, err = c.Suspend(ctx, v.ID); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("suspend answered:", v.Phase)
	if v, err = c.WaitAfter(ctx, v.ID, torpor.PhaseSuspended, v.Seq, 0); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("then:", v.Phase, "holding its state:", v.Restore.Held)

	if v, err = c.Resume(ctx, v.ID, torpor.ResumeOptions{}, ""); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("resume answered:", v.Phase)
	if v, err = c.WaitAfter(ctx, v.ID, torpor.PhaseReady, v.Seq, 0); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("then:", v.Phase, v.LastOutcome)
	// Output:
	// created: provisioning
	// then: ready
	// suspend answered: suspending
	// then: suspended holding its state: true
	// resume answered: starting
	// then: ready restored
}

// A command in the wrong phase is FAILED_PRECONDITION, which errors.Is
// tells; errors.As gives the code and the server's message.
func Example_errors() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := torpor.New(server.http, nil).WithToken(server.token)

	v, err := c.Create(ctx, torpor.CreateRequest{Driver: "sim"}, "")
	if err == nil {
		v, err = c.Wait(ctx, v.ID, torpor.PhaseReady, 0)
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = c.Resume(ctx, v.ID, torpor.ResumeOptions{}, "") // it is ready, not suspended
	fmt.Println("wrong phase:", errors.Is(err, torpor.ErrFailedPrecondition))
	var e *torpor.Error
	if errors.As(err, &e) {
		fmt.Println("code:", e.Code)
	}
	_, err = c.Get(ctx, "01a2b3c4-0000-7000-8000-000000000000")
	fmt.Println("unknown sandbox:", errors.Is(err, torpor.ErrNotFound))
	// Output:
	// wrong phase: true
	// code: FAILED_PRECONDITION
	// unknown sandbox: true
}

// The same over NATS, where producers live: commands on torpor.cmd.<verb>,
// the phase view from the KV bucket.
func ExampleNewBus() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A producer's and dashboard's credentials: torpor creds --role producer,dashboard -o client.creds
	nc, err := nats.Connect(server.nats, torpor.Credentials(server.creds)) // e.g. "nats://127.0.0.1:4222"
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	b, err := torpor.NewBus(nc)
	if err != nil {
		fmt.Println(err)
		return
	}
	v, err := b.Create(ctx, torpor.CreateRequest{Driver: "sim"}, "")
	if err == nil {
		v, err = b.Wait(ctx, v.ID, torpor.PhaseReady)
	}
	if err == nil {
		fmt.Println(v.Phase)
		v, err = b.Stop(ctx, v.ID)
	}
	if err == nil {
		v, err = b.WaitAfter(ctx, v.ID, torpor.PhaseStopped, v.Seq)
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(v.Phase)
	// Output:
	// ready
	// stopped
}

// Watch calls fn with each view change until fn returns an error (or ctx
// ends); it reconnects by itself after a dropped connection.
func ExampleClient_Watch() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := torpor.New(server.http, nil).WithToken(server.token)
	v, err := c.Create(ctx, torpor.CreateRequest{Driver: "sim"}, "")
	if err != nil {
		fmt.Println(err)
		return
	}
	errReady := errors.New("ready")
	err = c.Watch(ctx, 0, func(w torpor.View) error {
		if w.ID != v.ID {
			return nil // another sandbox
		}
		switch w.Phase {
		case torpor.PhaseReady:
			return errReady
		case torpor.PhaseProvisioning:
		default:
			// A phase this SDK may not know (a newer server): "other".
		}
		return nil
	})
	fmt.Println(errors.Is(err, errReady))
	// Output:
	// true
}
