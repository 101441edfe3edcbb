// Package busauth is who may do what on torpor's NATS bus: an operator, the
// torpor account (JetStream on, with limits in its claims) and a system
// account, their keys kept under <data>/auth, and the users minted for each
// role (service, producer, dashboard, driver, supervisor) with the
// publish/subscribe permissions of that role and nothing more. The nats-server
// checks every permission itself (NATS decentralized auth, user JWTs).
package busauth

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// The key files under the auth directory, each one nkey seed, mode 0600.
const (
	OperatorFile = "operator.nk"
	AccountFile  = "account.nk"
	SystemFile   = "system.nk"
	// ClientsFile is the key of the clients' account (producers and
	// dashboards), made on first use by a version that has it.
	ClientsFile = "clients.nk"
	// RevokedFile lists the revoked users of the torpor account, one
	// "<public key> <unix seconds>" a line: their JWTs issued up to then
	// are refused.
	RevokedFile = "revoked"
)

// The names the JWTs give the operator and the accounts.
const (
	OperatorName = "torpor"
	AccountName  = "TORPOR"
	SystemName   = "SYS"
	ClientsName  = "TORPOR_CLIENTS"
)

// Auth is the operator and accounts of one torpor bus, with the keys that
// sign them and the users of the torpor account.
type Auth struct {
	dir                       string
	lim                       Limits
	revoked                   map[string]int64
	operator, account, system nkeys.KeyPair
	clients                   nkeys.KeyPair
	// OperatorJWT is the operator's self-signed JWT, the one a nats-server
	// trusts (its operator setting).
	OperatorJWT string
	// AccountJWT is the torpor account's JWT, signed by the operator.
	AccountJWT string
	// SystemJWT is the system account's JWT, signed by the operator.
	SystemJWT string
	// ClientsJWT is the clients' account's JWT, signed by the operator.
	ClientsJWT string
	// AccountKey, SystemKey and ClientsKey are the accounts' public keys.
	AccountKey, SystemKey, ClientsKey string
}

// Limits are the torpor account's JetStream limits, in its claims (a
// nats-server in operator mode runs JetStream only for an account whose
// claims set them). -1 is no limit but the server's own.
type Limits struct {
	MemoryStorage int64
	DiskStorage   int64
	Streams       int64
	Consumers     int64
	// ClientConsumers bounds the consumers of the clients' account (every
	// watch and read of a producer or dashboard holds one while it lasts),
	// so that clients cannot fill the server with them; 0 is
	// DefaultClientConsumers. The clients' account holds its two copies
	// and no other stream.
	ClientConsumers int64
}

// DefaultClientConsumers is the clients' account's consumers at most.
const DefaultClientConsumers = 4096

// NoLimits leaves every JetStream limit to the server.
var NoLimits = Limits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumers: -1}

// Open loads the keys under dir, making each one missing (and dir, mode
// 0700) on first use, and signs the operator's and accounts' JWTs with lim.
// A key file that is there but cannot be read or is not a seed of its kind
// is an error, never replaced: every credential minted under the old key
// would stop working.
func Open(dir string, lim Limits) (*Auth, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("auth directory: %w", err)
	}
	a := &Auth{dir: dir, lim: lim}
	var err error
	if a.operator, err = key(filepath.Join(dir, OperatorFile), nkeys.PrefixByteOperator); err != nil {
		return nil, err
	}
	if a.account, err = key(filepath.Join(dir, AccountFile), nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	if a.system, err = key(filepath.Join(dir, SystemFile), nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	if a.clients, err = key(filepath.Join(dir, ClientsFile), nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	if a.revoked, err = readRevoked(filepath.Join(dir, RevokedFile)); err != nil {
		return nil, err
	}
	if err := a.sign(lim); err != nil {
		return nil, err
	}
	return a, nil
}

// readRevoked reads the revocations in path (none when it is missing).
func readRevoked(path string) (map[string]int64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]int64{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("revoked users: %w", err)
	}
	out := map[string]int64{}
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		var at int64
		if len(f) != 2 || !nkeys.IsValidPublicUserKey(f[0]) {
			return nil, fmt.Errorf("revoked users %s, line %d: want \"<user public key> <unix seconds>\"", path, i+1)
		}
		if _, err := fmt.Sscan(f[1], &at); err != nil {
			return nil, fmt.Errorf("revoked users %s, line %d: %v", path, i+1, err)
		}
		out[f[0]] = max(out[f[0]], at)
	}
	return out, nil
}

// Revoke revokes the user of creds (a credentials file's text): every JWT
// of its key issued until now is refused by a server that loads the
// account's JWT signed after this (the next start of the embedded server;
// a server run apart once its auth.conf is written again and reloaded).
// It returns the user's public key.
func (a *Auth) Revoke(creds []byte) (string, error) {
	tok, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return "", fmt.Errorf("credentials: %w", err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return "", fmt.Errorf("credentials: %w", err)
	}
	if uc.Issuer != a.AccountKey && uc.Issuer != a.ClientsKey {
		return "", fmt.Errorf("credentials of %q: not a user of this bus's account", uc.Name)
	}
	// Revocations hold at whole seconds, and cover a JWT issued in this
	// very second.
	at := time.Now().Unix() + 1
	f, err := os.OpenFile(filepath.Join(a.dir, RevokedFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return "", fmt.Errorf("revoked users: %w", err)
	}
	_, err = fmt.Fprintf(f, "%s %d\n", uc.Subject, at)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("revoked users: %w", err)
	}
	a.revoked[uc.Subject] = at
	return uc.Subject, a.sign(a.lim)
}

// key reads the seed in path, of kind, or makes one there (mode 0600).
func key(path string, kind nkeys.PrefixByte) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return newKey(path, kind)
	}
	if err != nil {
		return nil, fmt.Errorf("bus key: %w", err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return nil, fmt.Errorf("bus key %s: not an nkey seed (%v); restore it, or remove the auth directory to make a new bus identity (every credential minted under the old one stops working)", path, err)
	}
	seed, _ := kp.Seed()
	if p, _, err := nkeys.DecodeSeed(seed); err != nil || p != kind {
		return nil, fmt.Errorf("bus key %s: a seed of the wrong kind (want %s); restore it, or remove the auth directory to make a new bus identity", path, kind)
	}
	return kp, nil
}

func newKey(path string, kind nkeys.PrefixByte) (nkeys.KeyPair, error) {
	kp, err := nkeys.CreatePair(kind)
	if err != nil {
		return nil, fmt.Errorf("bus key: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("bus key: %w", err)
	}
	// O_EXCL: two processes starting on one directory at once must not
	// each write a key of their own.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return key(path, kind)
	}
	if err != nil {
		return nil, fmt.Errorf("bus key: %w", err)
	}
	_, err = f.Write(append(seed, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("bus key: %w", err)
	}
	return kp, nil
}

// sign makes the operator's and accounts' JWTs.
func (a *Auth) sign(lim Limits) error {
	opPub, err := a.operator.PublicKey()
	if err != nil {
		return err
	}
	if a.AccountKey, err = a.account.PublicKey(); err != nil {
		return err
	}
	if a.SystemKey, err = a.system.PublicKey(); err != nil {
		return err
	}
	if a.ClientsKey, err = a.clients.PublicKey(); err != nil {
		return err
	}
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = OperatorName
	oc.SystemAccount = a.SystemKey
	if a.OperatorJWT, err = oc.Encode(a.operator); err != nil {
		return fmt.Errorf("operator jwt: %w", err)
	}
	ac := jwt.NewAccountClaims(a.AccountKey)
	ac.Name = AccountName
	for pub, at := range a.revoked {
		ac.RevokeAt(pub, time.Unix(at, 0))
	}
	js := jwt.JetStreamLimits{
		MemoryStorage: lim.MemoryStorage,
		DiskStorage:   lim.DiskStorage,
		Streams:       lim.Streams,
		Consumer:      lim.Consumers,
	}
	ac.Limits.JetStreamLimits = js
	for _, e := range exports() {
		ac.Exports.Add(e)
	}
	if a.AccountJWT, err = ac.Encode(a.operator); err != nil {
		return fmt.Errorf("account jwt: %w", err)
	}
	cc := jwt.NewAccountClaims(a.ClientsKey)
	cc.Name = ClientsName
	for pub, at := range a.revoked {
		cc.RevokeAt(pub, time.Unix(at, 0))
	}
	cc.Limits.JetStreamLimits = jwt.JetStreamLimits{
		MemoryStorage: lim.MemoryStorage,
		DiskStorage:   lim.DiskStorage,
		Streams:       int64(len(copied)),
		Consumer:      cmp.Or(lim.ClientConsumers, DefaultClientConsumers),
	}
	for _, i := range imports(a.AccountKey) {
		cc.Imports.Add(i)
	}
	if a.ClientsJWT, err = cc.Encode(a.operator); err != nil {
		return fmt.Errorf("clients' account jwt: %w", err)
	}
	sc := jwt.NewAccountClaims(a.SystemKey)
	sc.Name = SystemName
	if a.SystemJWT, err = sc.Encode(a.operator); err != nil {
		return fmt.Errorf("system account jwt: %w", err)
	}
	return nil
}

// Accounts are the account JWTs by public key, as a nats-server's resolver
// preloads them.
func (a *Auth) Accounts() map[string]string {
	return map[string]string{a.AccountKey: a.AccountJWT, a.SystemKey: a.SystemJWT, a.ClientsKey: a.ClientsJWT}
}

// ServerConfig is the part of a nats-server configuration file that makes a
// separately run server trust this bus's operator and know its accounts
// (include it from the server's file), for `torpor serve --nats-url`.
func (a *Auth) ServerConfig() []byte {
	return fmt.Appendf(nil, `# torpor's bus: the operator and accounts of <data>/auth (torpor creds --server-config).
# torpor and its drivers connect with user credentials of the account %s,
# producers and dashboards with those of %s (torpor creds --role ...).
operator: %s
system_account: %s
resolver: MEMORY
resolver_preload: {
  %s: %s
  %s: %s
  %s: %s
}
`, AccountName, ClientsName, a.OperatorJWT, a.SystemKey, a.AccountKey, a.AccountJWT, a.ClientsKey, a.ClientsJWT, a.SystemKey, a.SystemJWT)
}
