// Package access keeps the HTTP API's bearer tokens: their hashes, scopes and
// expiry in the KV bucket torpor_tokens, a cache of them that every instance
// keeps current by watching the bucket (a revocation reaches every instance
// within a round trip), and the admin token that `torpor serve` mints on its
// first start so that the local CLI works without setup.
package access

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// Bucket is the KV bucket of the tokens: key = the token's name, value = its
// record (a hash of the secret, never the secret).
const Bucket = "torpor_tokens"

// Prefix starts every token's secret, so that a secret pasted where it does
// not belong is recognisable (and a scanner can find it); the token's name
// follows it.
const Prefix = "torpor_"

// record is a token as the bucket keeps it.
type record struct {
	events.TokenInfo
	// Hash is the hex SHA-256 of the secret. The secret is 32 random bytes,
	// so a fast hash is as good as a slow one: nothing can be guessed.
	Hash string `json:"hash"`
}

// Tokens is the token store of one instance.
type Tokens struct {
	kv  jetstream.KeyValue
	now func() time.Time

	mu     sync.RWMutex
	byHash map[string]record
	// rev is, per name, the bucket's newest revision this instance knows
	// of: a change the watch brings that is not newer (the put of a token
	// this instance has since revoked, still on its way) is old news and
	// is not applied, so a revoked token is never learnt again.
	rev map[string]uint64
}

// Open creates or binds the bucket and loads the tokens it holds. Run keeps
// the cache current.
func Open(ctx context.Context, js jetstream.JetStream, replicas int) (*Tokens, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: Bucket, Description: "torpor HTTP tokens: name → hash, scopes, expiry", History: 1,
		Replicas: max(replicas, 1), MaxValueSize: 4 << 10, MaxBytes: 64 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("tokens bucket: %w", err)
	}
	t := &Tokens{kv: kv, now: time.Now, byHash: map[string]record{}, rev: map[string]uint64{}}
	if err := t.load(ctx); err != nil {
		return nil, err
	}
	return t, nil
}

// load reads every token of the bucket into a fresh cache. A value that
// does not decode is skipped: it grants nothing.
func (t *Tokens) load(ctx context.Context) error {
	lister, err := t.kv.ListKeys(ctx)
	if err != nil {
		return fmt.Errorf("tokens: %w", err)
	}
	fresh := map[string]record{}
	revs := map[string]uint64{}
	for name := range lister.Keys() {
		e, err := t.kv.Get(ctx, name)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("token %s: %w", name, err)
		}
		revs[name] = e.Revision()
		if r, ok := decode(e.Key(), e.Value()); ok {
			fresh[r.Hash] = r
		}
	}
	t.mu.Lock()
	t.byHash = fresh
	for name, r := range revs {
		t.rev[name] = max(t.rev[name], r)
	}
	t.mu.Unlock()
	return nil
}

// decode is the record of a bucket value under key, if it is one: its name
// is the key, its hash and scopes are well formed.
func decode(key string, value []byte) (record, bool) {
	var r record
	if json.Unmarshal(value, &r) != nil || r.Name != key || len(r.Hash) != sha256.Size*2 || len(r.Scopes) == 0 {
		return record{}, false
	}
	if _, err := hex.DecodeString(r.Hash); err != nil {
		return record{}, false
	}
	for _, s := range r.Scopes {
		if !slices.Contains(events.Scopes, s) {
			return record{}, false
		}
	}
	return r, true
}

// Run watches the bucket and keeps the cache current until ctx ends. A
// watch that ends (its consumer lost with the server) is started again
// after a second, the bucket read whole first.
func (t *Tokens) Run(ctx context.Context) error {
	for {
		t.watch(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
		_ = t.load(ctx) // a failed read leaves the cache as it was; the next miss reads again
	}
}

// watch applies the bucket's changes to the cache until ctx ends or the
// watch does.
func (t *Tokens) watch(ctx context.Context) {
	w, err := t.kv.WatchAll(ctx)
	if err != nil {
		return
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				continue // the initial values are in
			}
			t.apply(e)
		}
	}
}

// apply folds one change of the bucket into the cache: a token written
// replaces any token of its name, a deleted one is gone.
func (t *Tokens) apply(e jetstream.KeyValueEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.Revision() <= t.rev[e.Key()] {
		return // this instance knows a newer change of the name
	}
	t.rev[e.Key()] = e.Revision()
	for h, r := range t.byHash {
		if r.Name == e.Key() {
			delete(t.byHash, h)
		}
	}
	if e.Operation() != jetstream.KeyValuePut {
		return
	}
	if r, ok := decode(e.Key(), e.Value()); ok {
		t.byHash[r.Hash] = r
	}
}

// hash is the hex SHA-256 of a secret.
func hash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Authenticate returns the token whose secret is secret: UNAUTHENTICATED for
// an unknown, revoked or expired one (the message never says which). A
// secret the cache does not know is looked up by the name it carries, so a
// token made on another instance a moment ago, before the watch brought it
// here, is taken at once.
func (t *Tokens) Authenticate(ctx context.Context, secret string) (events.TokenInfo, error) {
	refused := events.Errorf(events.CodeUnauthenticated, "the bearer token is unknown, revoked or expired")
	name, ok := nameOf(secret)
	if !ok {
		return events.TokenInfo{}, events.Errorf(events.CodeUnauthenticated, "the bearer token is not a torpor token")
	}
	h := hash(secret)
	r, ok := t.lookup(h)
	if !ok {
		e, err := t.kv.Get(ctx, name)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			return events.TokenInfo{}, refused
		case err != nil:
			return events.TokenInfo{}, events.Errorf(events.CodeUnavailable, "tokens: %v", err)
		}
		if r, ok = decode(e.Key(), e.Value()); !ok {
			return events.TokenInfo{}, refused
		}
	}
	if subtle.ConstantTimeCompare([]byte(r.Hash), []byte(h)) != 1 || r.Name != name {
		return events.TokenInfo{}, refused
	}
	if r.ExpiresAt != nil && !t.now().Before(*r.ExpiresAt) {
		return events.TokenInfo{}, refused
	}
	return r.TokenInfo, nil
}

// secretLen is the length of a secret's random part: 32 bytes, base64url.
var secretLen = base64.RawURLEncoding.EncodedLen(32)

// nameOf is the token name a secret carries (Prefix, the name, '_', 32
// random bytes), if it is well formed.
func nameOf(secret string) (string, bool) {
	rest, ok := strings.CutPrefix(secret, Prefix)
	if !ok || len(rest) < secretLen+2 || rest[len(rest)-secretLen-1] != '_' {
		return "", false
	}
	name := rest[:len(rest)-secretLen-1]
	if events.CheckTokenName(name) != nil {
		return "", false
	}
	return name, true
}

func (t *Tokens) lookup(h string) (record, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	r, ok := t.byHash[h]
	return r, ok
}

// newSecret is a fresh secret for the token named name: Prefix, the name,
// '_' and 32 random bytes. The name is no secret: it lets any instance find
// the token's record, and a reader of a leaked secret see whose it is.
func newSecret(name string) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return Prefix + name + "_" + base64.RawURLEncoding.EncodeToString(b), nil
}

// Create makes a token named req.Name with req's scopes and expiry; by is
// who asked (the actor). A name in use is ALREADY_EXISTS. The secret is in
// the answer and nowhere else.
func (t *Tokens) Create(ctx context.Context, req events.TokenRequest, by string) (events.NewToken, error) {
	return t.put(ctx, req, by, false)
}

// put writes a token; replace overwrites a token of the same name.
func (t *Tokens) put(ctx context.Context, req events.TokenRequest, by string, replace bool) (events.NewToken, error) {
	if err := events.CheckTokenName(req.Name); err != nil {
		return events.NewToken{}, err
	}
	names := make([]string, len(req.Scopes))
	for i, s := range req.Scopes {
		names[i] = string(s)
	}
	scopes, err := events.ParseScopes(names)
	if err != nil {
		return events.NewToken{}, err
	}
	now := t.now().UTC()
	info := events.TokenInfo{Name: req.Name, Scopes: scopes, CreatedAt: now, CreatedBy: by}
	if req.Expires != "" {
		d, err := events.ParseExpiry(req.Expires)
		if err != nil {
			return events.NewToken{}, err
		}
		at := now.Add(d)
		info.ExpiresAt = &at
	}
	secret, err := newSecret(req.Name)
	if err != nil {
		return events.NewToken{}, err
	}
	r := record{TokenInfo: info, Hash: hash(secret)}
	data, err := json.Marshal(r)
	if err != nil {
		return events.NewToken{}, err
	}
	var rev uint64
	if replace {
		rev, err = t.kv.Put(ctx, req.Name, data)
	} else {
		rev, err = t.kv.Create(ctx, req.Name, data)
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		return events.NewToken{}, events.Errorf(events.CodeAlreadyExists, "token %s exists (revoke it first)", req.Name)
	}
	if err != nil {
		return events.NewToken{}, events.Errorf(events.CodeUnavailable, "token %s: %v", req.Name, err)
	}
	t.mu.Lock()
	for h, old := range t.byHash {
		if old.Name == req.Name {
			delete(t.byHash, h)
		}
	}
	t.byHash[r.Hash] = r
	t.rev[req.Name] = max(t.rev[req.Name], rev)
	t.mu.Unlock()
	return events.NewToken{TokenInfo: info, Token: secret}, nil
}

// List returns every token, by name.
func (t *Tokens) List(ctx context.Context) ([]events.TokenInfo, error) {
	if err := t.load(ctx); err != nil {
		return nil, events.Errorf(events.CodeUnavailable, "%v", err)
	}
	t.mu.RLock()
	out := make([]events.TokenInfo, 0, len(t.byHash))
	for _, r := range t.byHash {
		out = append(out, r.TokenInfo)
	}
	t.mu.RUnlock()
	slices.SortFunc(out, func(a, b events.TokenInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Revoke deletes the token named name: from then on no instance takes it.
// An unknown name is NOT_FOUND.
func (t *Tokens) Revoke(ctx context.Context, name string) error {
	if err := events.CheckTokenName(name); err != nil {
		return err
	}
	e, err := t.kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return events.Errorf(events.CodeNotFound, "no token named %s", name)
	} else if err != nil {
		return events.Errorf(events.CodeUnavailable, "token %s: %v", name, err)
	}
	if err := t.kv.Delete(ctx, name); err != nil {
		return events.Errorf(events.CodeUnavailable, "revoke %s: %v", name, err)
	}
	t.mu.Lock()
	// Every change up to the one deleted is old news from now on: the
	// watch may still bring the token's put.
	t.rev[name] = max(t.rev[name], e.Revision())
	for h, r := range t.byHash {
		if r.Name == name {
			delete(t.byHash, h)
		}
	}
	t.mu.Unlock()
	return nil
}

// AdminFile is the name of the admin token's file under serve's --data.
const AdminFile = "admin.token"

// Bootstrap makes sure the local operator can reach the service: when the
// file path does not exist, it mints an admin token and writes its secret
// there (mode 0600), named "admin", or "admin-<node>" when another
// instance's bootstrap took "admin" (a record of that name is this node's,
// whose file was lost, and is replaced). It answers the token's name and
// whether it minted one. A file that exists is left as it is, even if its
// token was revoked: an operator who revoked it meant it (delete the file
// and restart for a fresh one).
func (t *Tokens) Bootstrap(ctx context.Context, path, node string) (string, bool, error) {
	if data, err := os.ReadFile(path); err == nil {
		info, aerr := t.Authenticate(ctx, strings.TrimSpace(string(data)))
		if aerr != nil {
			return "", false, nil
		}
		return info.Name, false, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", false, fmt.Errorf("admin token: %w", err)
	}
	req := events.TokenRequest{Name: "admin", Scopes: []events.Scope{events.ScopeAdmin}}
	tok, err := t.put(ctx, req, "serve", false)
	if events.CodeOf(err) == events.CodeAlreadyExists {
		req.Name = "admin-" + node
		tok, err = t.put(ctx, req, "serve", true)
	}
	if err != nil {
		return "", false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", false, fmt.Errorf("admin token: %w", err)
	}
	// Written whole to a temporary file, then renamed: a reader never
	// sees half a token, and the file is 0600 from its first byte.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".admin.token-*")
	if err != nil {
		return "", false, fmt.Errorf("admin token: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err == nil {
		_, err = tmp.WriteString(tok.Token + "\n")
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), path)
		}
		if err != nil {
			return "", false, fmt.Errorf("admin token: %w", err)
		}
	} else {
		tmp.Close()
		return "", false, fmt.Errorf("admin token: %w", err)
	}
	return tok.Name, true, nil
}
