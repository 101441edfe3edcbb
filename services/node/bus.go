package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/internal/busauth"
	"github.com/torpor/torpor/projections/kvview"
)

// openAuth opens the bus's keys under <data>/auth (making them on the
// embedded server's first start) and the user the service connects as.
func (a *Node) openAuth(cfg Config) error {
	dir := filepath.Join(cfg.Data, "auth")
	if cfg.NATSURL == "" || cfg.Data != "" && exists(filepath.Join(dir, busauth.AccountFile)) {
		var err error
		if a.auth, err = busauth.Open(dir, busauth.NoLimits); err != nil {
			return events.Errorf(events.CodeFailedPrecondition, "%v", err)
		}
	}
	if cfg.NATSCreds != "" {
		b, err := os.ReadFile(cfg.NATSCreds)
		if err != nil {
			return invalid(fmt.Errorf("--nats-creds: %w", err))
		}
		if a.user, err = busauth.ParseCreds(b, busauth.Grant{Role: busauth.Service}); err != nil {
			return invalid(fmt.Errorf("--nats-creds %s: %w", cfg.NATSCreds, err))
		}
		return nil
	}
	if a.auth != nil {
		var err error
		a.user, err = a.auth.User("torpor "+cfg.Node, 0, busauth.Grant{Role: busauth.Service})
		return err
	}
	return nil
}

// makeCopies makes the clients' account's copies of the log and the view
// (busauth.Copies), which producers and dashboards read, as this
// service's user of that account; a service without the bus's keys (it
// joined with --nats-creds) leaves them to the one that has them.
func (a *Node) makeCopies(ctx context.Context, url, ca string, maxLog int64, replicas int, log zerolog.Logger) error {
	if a.auth == nil {
		if a.user != nil {
			log.Info().Msg("no bus keys under --data (auth/): the clients' copies of the log and the view are made by a service that has them")
		}
		return nil
	}
	u, err := a.auth.User("torpor clients' copies", 0, busauth.Grant{Role: busauth.ClientsService})
	if err != nil {
		return err
	}
	opts := append(u.Options(), nats.Name("torpor copies"))
	if ca != "" {
		opts = append(opts, nats.RootCAs(ca))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return fmt.Errorf("connect as the clients' service: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if maxLog == 0 {
		maxLog = jsstore.DefaultMaxBytes
	}
	return busauth.Copies(ctx, js, busauth.CopyLimits{Events: maxLog, Phases: kvview.DefaultMaxBytes, Replicas: replicas,
		Async: a.ns != nil, OriginLast: a.originLast})
}

// originLast is the last sequence of stream, an origin of the clients'
// account's copies (busauth.CopyLimits.OriginLast).
func (a *Node) originLast(ctx context.Context, stream string) (uint64, error) {
	js, err := jetstream.New(a.nc)
	if err != nil {
		return 0, err
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	return s.CachedInfo().State.LastSeq, nil
}

// revocationPoll is how often the embedded server's service looks for new
// revocations (torpor creds --revoke, run beside it).
const revocationPoll = time.Second

// followRevocations gives the embedded server the accounts signed anew
// each time <data>/auth/revoked changes, until ctx ends: a revoked user's
// connections are closed and it cannot connect again, without a restart.
func (a *Node) followRevocations(ctx context.Context, dir string, log zerolog.Logger) error {
	path := filepath.Join(dir, busauth.RevokedFile)
	stamp := func() string {
		fi, err := os.Stat(path)
		if err != nil {
			return ""
		}
		return fmt.Sprint(fi.Size(), fi.ModTime().UnixNano())
	}
	last := stamp()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(revocationPoll):
		}
		now := stamp()
		if now == last {
			continue
		}
		auth, err := busauth.Open(dir, busauth.NoLimits)
		if err != nil {
			log.Warn().Err(err).Str("part", "revocations").Msg("revocations not applied")
			continue
		}
		last = now
		for key, tok := range auth.Accounts() {
			acc, err := a.ns.LookupAccount(key)
			if err != nil {
				continue
			}
			claims, err := jwt.DecodeAccountClaims(tok)
			if err != nil {
				return err
			}
			if res := a.ns.AccountResolver(); res != nil {
				_ = res.Store(key, tok)
			}
			a.ns.UpdateAccountClaims(acc, claims)
		}
		log.Info().Str("part", "revocations").Msg("revoked users refused from now on")
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// supervisorCreds mints each supervisor's NATS user: one that reports for
// its sandbox only, for its generation. A service that joined a server
// without holding the account's key (--nats-url, no <data>/auth) hands its
// supervisors its own credentials, and says so.
func (a *Node) supervisorCreds(log zerolog.Logger) func(id string, gen int64) (string, error) {
	if a.auth == nil {
		if a.user == nil {
			return nil
		}
		log.Warn().Msg("no bus keys under --data (auth/): supervisors connect with this service's --nats-creds, not a user of their own sandbox")
		creds, err := a.user.Creds()
		return func(string, int64) (string, error) { return string(creds), err }
	}
	return func(id string, gen int64) (string, error) {
		u, err := a.auth.User(fmt.Sprintf("supervisor %s generation %d", id, gen), busauth.SupervisorTTL, busauth.Grant{Role: busauth.Supervisor, Sandbox: id})
		if err != nil {
			return "", err
		}
		b, err := u.Creds()
		return string(b), err
	}
}

// NATSOptionsAs are the nats.Connect options of a user holding grants,
// minted under the bus's keys (for tests and in-process clients).
func (a *Node) NATSOptionsAs(grants ...busauth.Grant) ([]nats.Option, error) {
	if a.auth == nil {
		return nil, errors.New("no bus keys to mint a user with")
	}
	u, err := a.auth.User("torpor client", time.Hour, grants...)
	if err != nil {
		return nil, err
	}
	return u.Options(), nil
}

// NATSOptions are the options that connect to the service's NATS as the
// service (the bench's connections).
func (a *Node) NATSOptions() []nats.Option {
	if a.user == nil {
		return nil
	}
	return a.user.Options()
}
