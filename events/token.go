package events

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Scope is what an HTTP bearer token may do (CONTRACT §5, the README's
// Security section): read the views and history, write (send the lifecycle
// commands, open forwards), or administer the service (replay, tokens, and
// everything read and write may). admin holds every scope.
type Scope string

const (
	ScopeRead  Scope = "read"
	ScopeWrite Scope = "write"
	ScopeAdmin Scope = "admin"
)

// Scopes are the scopes a token may hold.
var Scopes = []Scope{ScopeRead, ScopeWrite, ScopeAdmin}

// ParseScopes reads a list of scopes ("read,write"), refusing an unknown
// one or an empty list; each is kept once, in the order of Scopes.
func ParseScopes(s []string) ([]Scope, error) {
	var out []Scope
	for _, part := range s {
		for _, name := range strings.Split(part, ",") {
			name = strings.TrimSpace(name)
			if name == "" {
				continue
			}
			if !slices.Contains(Scopes, Scope(name)) {
				return nil, Errorf(CodeInvalidArgument, "scope %q: want read, write or admin", name)
			}
			out = append(out, Scope(name))
		}
	}
	if len(out) == 0 {
		return nil, Errorf(CodeInvalidArgument, "no scope: want one or more of read, write, admin")
	}
	kept := make([]Scope, 0, len(out))
	for _, sc := range Scopes {
		if slices.Contains(out, sc) {
			kept = append(kept, sc)
		}
	}
	return kept, nil
}

// Allows reports whether holding scopes grants need: the scope itself, or
// admin.
func Allows(scopes []Scope, need Scope) bool {
	return slices.Contains(scopes, need) || slices.Contains(scopes, ScopeAdmin)
}

// validTokenName is what a token's name may be: the actor of every command
// sent with it (`token:<name>`), so a sandbox name's alphabet.
var validTokenName = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)

// CheckTokenName refuses a token name that is not 1 to 63 of a-z, 0-9, '.',
// '_', '-', alphanumeric at both ends, with no two dots in a row: the name is
// a key of the bucket torpor_tokens, whose subject tokens cannot be empty (the
// server refused such a key, which was a 503).
func CheckTokenName(name string) error {
	if !validTokenName.MatchString(name) || strings.Contains(name, "..") {
		return Errorf(CodeInvalidArgument, "token name %q: want 1 to 63 of a-z 0-9 . _ -, alphanumeric at both ends, no two dots in a row", name)
	}
	return nil
}

// TokenRequest is the body of POST /v1/tokens: a new token's name, its
// scopes and, optionally, how long it lasts ("720h", "30d"; none: it does
// not expire).
type TokenRequest struct {
	Name    string  `json:"name"`
	Scopes  []Scope `json:"scopes"`
	Expires string  `json:"expires,omitempty"`
}

// TokenInfo is what the service tells of a token: never the secret, which
// it does not keep (only its hash).
type TokenInfo struct {
	Name      string     `json:"name"`
	Scopes    []Scope    `json:"scopes"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	CreatedBy string     `json:"created_by,omitempty"`
}

// NewToken is the answer to a token's creation: its secret, shown this once.
type NewToken struct {
	TokenInfo
	Token string `json:"token"`
}

// ParseExpiry reads a token's lifetime: a Go duration ("720h") or whole
// days ("30d"); it must be positive.
func ParseExpiry(s string) (time.Duration, error) {
	var d time.Duration
	var err error
	if n, ok := strings.CutSuffix(s, "d"); ok {
		var days int
		if _, err = fmt.Sscanf(n, "%d", &days); err == nil && fmt.Sprint(days) == n {
			d = time.Duration(days) * 24 * time.Hour
		} else {
			err = fmt.Errorf("not a number of days")
		}
	} else {
		d, err = time.ParseDuration(s)
	}
	if err != nil || d <= 0 {
		return 0, Errorf(CodeInvalidArgument, "expires %q: want a positive duration (720h) or days (30d)", s)
	}
	return d, nil
}
