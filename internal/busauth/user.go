package busauth

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// User is a user of the torpor account or the clients' account: its JWT and the seed of its key,
// which together are a NATS credential.
type User struct {
	JWT  string
	Seed []byte
	// Inbox is the inbox prefix its connections use (Inbox).
	Inbox string
}

// SupervisorTTL is how long a supervisor's credential is valid: a
// generation that runs longer loses its supervisor's connection (the
// credential is minted anew at every start and resume).
const SupervisorTTL = 365 * 24 * time.Hour

// respMax is how many messages a user that answers requests may send to
// one request's reply subject, deliveries of the request included.
const respMax = 4

// User mints a user named name holding grants, valid for ttl (0: no
// expiry), signed by the account of its roles (producers and dashboards:
// the clients' account; the others: the torpor account; never both).
func (a *Auth) User(name string, ttl time.Duration, grants ...Grant) (*User, error) {
	if len(grants) == 0 {
		return nil, errors.New("user: no role")
	}
	for _, g := range grants {
		if err := g.Validate(); err != nil {
			return nil, err
		}
	}
	signer, clients := a.account, grants[0].Role.clients()
	for _, g := range grants[1:] {
		if g.Role.clients() != clients {
			return nil, fmt.Errorf("user: roles %s and %s are of two accounts (producers and dashboards are of %s, the others of %s)", grants[0].Role, g.Role, ClientsName, AccountName)
		}
	}
	if clients {
		signer = a.clients
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	uc := jwt.NewUserClaims(pub)
	uc.Name = name
	for _, g := range grants {
		// What the service reads of who sent a command (the clients'
		// import shares the sender's JWT tags).
		uc.Tags.Add("role:" + string(g.Role))
	}
	if ttl > 0 {
		uc.Expires = time.Now().Add(ttl).Unix()
	}
	p := union(grants)
	inbox := Inbox(grants...)
	if clients && !p.all {
		// Each client reads its answers on an inbox of its own, which
		// no other client may read (ClientInbox).
		inbox = ClientInbox(pub)
		for i, sub := range p.sub {
			if sub == DefaultInbox+".>" {
				p.sub[i] = inbox + ".>"
			}
		}
	}
	if !p.all {
		// An allow list, so a permission is nothing unless granted.
		uc.Pub.Allow = p.pub
		uc.Sub.Allow = p.sub
		if len(uc.Pub.Allow) == 0 {
			uc.Pub.Deny = []string{">"}
		}
		if p.resp {
			// The server counts every delivery of a request against the
			// answers it allows, and a driver gets each request twice (its
			// operation's endpoint and the catch-all that answers unknown
			// operations): one answer needs a count of 2 or more.
			uc.Resp = &jwt.ResponsePermission{MaxMsgs: respMax, Expires: time.Minute}
		}
	}
	tok, err := uc.Encode(signer)
	if err != nil {
		return nil, fmt.Errorf("user jwt: %w", err)
	}
	return &User{JWT: tok, Seed: seed, Inbox: inbox}, nil
}

// ClientInbox is the inbox prefix of the client (producer, dashboard)
// whose public key is pub: its connections must use it
// (nats.CustomInboxPrefix, `nats --inbox-prefix`), and it is the only
// inbox that client may read, so that no client reads another's answers.
// torpor creds prints it; the Go SDK's Credentials reads it from the file.
func ClientInbox(pub string) string {
	return DefaultInbox + "_" + pub[max(0, len(pub)-20):]
}

// Creds is u as a NATS credentials file (what `nats --creds` and
// nats.UserCredentials read).
func (u *User) Creds() ([]byte, error) {
	return jwt.FormatUserConfig(u.JWT, u.Seed)
}

// Options are the nats.Connect options that connect as u.
func (u *User) Options() []nats.Option {
	return []nats.Option{nats.UserJWTAndSeed(u.JWT, string(u.Seed)), nats.CustomInboxPrefix(u.Inbox)}
}

// ParseCreds reads a credentials file's text into a User, with the inbox
// of grants.
func ParseCreds(creds []byte, grants ...Grant) (*User, error) {
	tok, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	kp, err := jwt.ParseDecoratedUserNKey(creds)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	inbox := Inbox(grants...)
	if own, err := CredsInbox(creds); err == nil && own != "" {
		inbox = own
	}
	return &User{JWT: tok, Seed: seed, Inbox: inbox}, nil
}

// CredsInbox is the inbox prefix the user of a credentials file must use:
// its own (ClientInbox) when its permissions say so, else "" (the
// default, _INBOX).
func CredsInbox(creds []byte) (string, error) {
	tok, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return "", fmt.Errorf("credentials: %w", err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return "", fmt.Errorf("credentials: %w", err)
	}
	own := ClientInbox(uc.Subject)
	if slices.Contains(uc.Sub.Allow, own+".>") {
		return own, nil
	}
	return "", nil
}

// CredsReport says whether the user of a credentials file may publish
// every sandbox's supervisor reports (ReportSubjects): a service, or a
// driver minted with SimReports. `torpor driver --drivers sim` asks it at
// start, so that a credential without it is refused there rather than at
// each of the sim's reports.
func CredsReport(creds []byte) (bool, error) {
	tok, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return false, fmt.Errorf("credentials: %w", err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return false, fmt.Errorf("credentials: %w", err)
	}
	if len(uc.Pub.Allow) == 0 {
		// No allow list: everything but what is denied (User denies all
		// to a user with no publication at all).
		return len(uc.Pub.Deny) == 0, nil
	}
	for _, s := range []string{ReportSubjects, "torpor.supervisor.>", "torpor.>", ">"} {
		if slices.Contains(uc.Pub.Allow, s) {
			return true, nil
		}
	}
	return false, nil
}
