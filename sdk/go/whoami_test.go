package torpor_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	torpor "github.com/torpor/torpor/sdk/go"
)

// TestHTTPWhoAmI: the server names the token a client sends and its scopes;
// without a token it refuses.
func TestHTTPWhoAmI(t *testing.T) {
	ctx := ctxFor(t)
	admin := client()
	name := "whoami-" + unique()[24:]
	tok, err := admin.CreateToken(ctx, torpor.TokenRequest{Name: name, Scopes: []torpor.Scope{torpor.ScopeRead}})
	if err != nil {
		t.Fatal(err)
	}
	// The admin token's name is in its secret: torpor_<name>_<43 characters>.
	adminName := strings.TrimPrefix(server.token[:len(server.token)-44], "torpor_")
	for _, c := range []struct {
		token string
		want  torpor.WhoAmI
	}{
		{server.token, torpor.WhoAmI{Name: adminName, Scopes: []torpor.Scope{torpor.ScopeAdmin}}},
		{tok.Token, torpor.WhoAmI{Name: name, Scopes: []torpor.Scope{torpor.ScopeRead}}},
	} {
		got, err := torpor.New(server.http, nil).WithToken(c.token).WhoAmI(ctx)
		if err != nil || got.Name != c.want.Name || !slices.Equal(got.Scopes, c.want.Scopes) {
			t.Errorf("whoami as %s: %+v, %v; want %+v", c.want.Name, got, err, c.want)
		}
	}
	if got, err := torpor.New(server.http, nil).WhoAmI(ctx); !errors.Is(err, torpor.ErrUnauthenticated) {
		t.Errorf("whoami without a token: %+v, %v; want UNAUTHENTICATED", got, err)
	}
}
