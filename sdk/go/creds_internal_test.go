package torpor

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/torpor/torpor/internal/busauth"
)

// TestCredsInbox: the SDK reads from a credentials file the inbox the
// service gave its user (busauth.ClientInbox), and none for a user of
// torpor's own account.
func TestCredsInbox(t *testing.T) {
	a, err := busauth.Open(filepath.Join(t.TempDir(), "auth"), busauth.NoLimits)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		grant busauth.Grant
		own   bool
	}{
		{"producer", busauth.Grant{Role: busauth.Producer}, true},
		{"dashboard", busauth.Grant{Role: busauth.Dashboard}, true},
		{"service", busauth.Grant{Role: busauth.Service}, false},
		{"driver", busauth.Grant{Role: busauth.Driver, Node: "n1"}, false},
	} {
		u, err := a.User(c.name, time.Hour, c.grant)
		if err != nil {
			t.Fatal(err)
		}
		creds, err := u.Creds()
		if err != nil {
			t.Fatal(err)
		}
		got, err := credsInbox(creds)
		want := ""
		if c.own {
			want = u.Inbox
		}
		if err != nil || got != want {
			t.Errorf("%s: inbox %q %v, want %q", c.name, got, err, want)
		}
	}
	if _, err := credsInbox([]byte("not a credentials file")); err == nil {
		t.Error("a file without a JWT: no error")
	}
}
