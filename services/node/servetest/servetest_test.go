package servetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/node/servetest"
)

// TestTokensHaveTheirScopes: the write token creates, the read token reads
// and is refused a create by the server, and the harness's environment
// names all three.
func TestTokensHaveTheirScopes(t *testing.T) {
	s := servetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	addr := s.URL[len("http://"):]
	v, err := torpor.New(addr, nil).WithToken(s.Write).Create(ctx, torpor.CreateRequest{Driver: "sim"}, "")
	if err != nil {
		t.Fatalf("create with the write token: %v", err)
	}
	if _, err := torpor.New(addr, nil).WithToken(s.Read).Get(ctx, v.ID); err != nil {
		t.Fatalf("get with the read token: %v", err)
	}
	_, err = torpor.New(addr, nil).WithToken(s.Read).Create(ctx, torpor.CreateRequest{Driver: "sim"}, "")
	if !errors.Is(err, torpor.ErrPermissionDenied) {
		t.Fatalf("create with the read token: %v, want PERMISSION_DENIED", err)
	}
	if got := len(s.Env()); got != 5 {
		t.Fatalf("Env has %d entries, want 5", got)
	}
}
