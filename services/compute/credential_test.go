package compute_test

import (
	"testing"

	"github.com/torpor/torpor/services/compute"
)

// FuzzCredential: under any secret the service would take, the credential
// minted for (sandbox, generation) verifies for that pair and for no other,
// and any other string (forged, garbled, another pair's) verifies for no
// pair; a secret too short is refused. Go test -fuzz (.ci/run runs it for
// a few seconds).
func FuzzCredential(f *testing.F) {
	const id = "0193b0a4-0000-7000-8000-000000000001"
	for _, s := range []struct {
		secret    string
		id        string
		gen       int64
		otherID   string
		otherGen  int64
		forged    string
		forgedGen int64
	}{
		{"0123456789abcdef0123456789abcdef", id, 1, id, 2, "", 1},
		{"0123456789abcdef", id, 2, "0193b0a4-0000-7000-8000-000000000002", 2, "00", 2},
		{"0123456789abcdef", id, 1, id + "\x00", 1, "credential-of-1", 1},
		{"0123456789abcdef", "a\x001", 2, "a", 12, "zz", 2},
		{"0123456789abcdef", "a1", 2, "a", 12, "zz", 2},
		{"0123456789abcdef", "a", -1, "a", 1, "-1", -1},
		{"short", id, 1, id, 1, "", 0},
		{"0123456789abcdef0123456789abcdef", "", 0, "", 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", 0},
	} {
		f.Add([]byte(s.secret), s.id, s.gen, s.otherID, s.otherGen, s.forged, s.forgedGen)
	}
	f.Fuzz(func(t *testing.T, secret []byte, id string, gen int64, otherID string, otherGen int64, forged string, forgedGen int64) {
		c, err := compute.NewCredentials(secret)
		if len(secret) < 16 {
			if err == nil {
				t.Fatalf("a secret of %d bytes was taken", len(secret))
			}
			return
		}
		if err != nil {
			t.Fatalf("a secret of %d bytes: %v", len(secret), err)
		}
		cred := c.Mint(id, gen)
		if !c.Verify(id, gen, cred) {
			t.Fatalf("the credential of %q generation %d does not verify for it", id, gen)
		}
		if (otherID != id || otherGen != gen) && c.Verify(otherID, otherGen, cred) {
			t.Fatalf("the credential of %q generation %d verifies for %q generation %d", id, gen, otherID, otherGen)
		}
		if forged != c.Mint(id, forgedGen) && c.Verify(id, forgedGen, forged) {
			t.Fatalf("%q verifies for %q generation %d", forged, id, forgedGen)
		}
		// Under another secret, the credential is another's.
		other := append([]byte{secret[0] ^ 1}, secret[1:]...)
		oc, err := compute.NewCredentials(other)
		if err != nil {
			t.Fatal(err)
		}
		if oc.Verify(id, gen, cred) {
			t.Fatalf("a credential minted under one secret verifies under another")
		}
	})
}
