// Package supervisor is what every driver's supervisor (`torpor supervise`,
// beside a process group or a QEMU) shares: how it sends its reports to the
// gateways, and how it takes its credential.
package supervisor

import (
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/busauth"
	"github.com/torpor/torpor/services/compute"
)

// CredentialEnv is the environment variable through which a supervisor
// gets its credential: the environment, unlike the arguments, is not for
// every user of the machine to read. The workload does not inherit it.
const CredentialEnv = "TORPOR_SUPERVISOR_CREDENTIAL"

// BusCredsEnv is the environment variable through which a supervisor gets
// its NATS credentials file's text (compute.Start.BusCreds), as
// CredentialEnv: the workload does not inherit it.
const BusCredsEnv = "TORPOR_SUPERVISOR_NATS_CREDS"

// How often a supervisor retries a report nobody answered, and how long it
// waits for one answer.
const (
	BackoffMin     = 50 * time.Millisecond
	BackoffMax     = 2 * time.Second
	RequestTimeout = 2 * time.Second
)

// Sender sends one supervisor's reports on compute.ReportSubject. The zero
// value is not usable: set NC and Log.
type Sender struct {
	NC  *nats.Conn
	Log zerolog.Logger
	// unanswered: the last report got no answer; beat is the answer to
	// the last heartbeat.
	unanswered bool
	beat       string
}

// Send asks a gateway to take r and says whether one answered, taking it
// or refusing it. What it logs is the changes: the first report unanswered
// (the service is down, say) and the first answered after, every refusal of
// an attach or an exit, and a heartbeat's answer when it differs from the
// last heartbeat's, so a supervisor waiting out a long downtime, or
// heartbeating where heartbeats are refused, does not fill its log.
func (s *Sender) Send(r compute.Report) bool {
	log := s.Log.With().Int64("generation", r.Generation).Str("kind", r.Kind).Logger()
	data, err := json.Marshal(r)
	if err != nil {
		log.Error().Err(err).Msg("report")
		return true
	}
	msg, err := s.NC.Request(compute.ReportSubject(r.SandboxID), data, RequestTimeout)
	if err != nil {
		if !s.unanswered {
			log.Warn().Err(err).Msg("report unanswered; reports are asked again until a gateway answers")
		}
		s.unanswered = true
		return false
	}
	if s.unanswered {
		log.Info().Msg("reports answered again")
		s.unanswered = false
	}
	answer := "taken"
	var body events.ErrorBody
	if json.Unmarshal(msg.Data, &body) == nil && body.Error != nil {
		answer = string(body.Error.Code) + ": " + body.Error.Message
	}
	if r.Kind == compute.ReportHeartbeat {
		if answer == s.beat {
			return true
		}
		s.beat = answer
	}
	if body.Error != nil {
		log.Warn().Str("code", string(body.Error.Code)).Str("message", body.Error.Message).Msg("report refused")
	} else {
		log.Info().Msg("report taken")
	}
	return true
}

// Connect connects a supervisor of sandbox to url as the user of creds (a
// NATS credentials file's text; empty: none), retrying for ever: a service
// down now is asked again.
func Connect(url, sandbox, creds, ca string) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name("torpor supervise " + sandbox),
		nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true), nats.ReconnectWait(250 * time.Millisecond)}
	if ca != "" {
		opts = append(opts, nats.RootCAs(ca))
	}
	if creds != "" {
		u, err := busauth.ParseCreds([]byte(creds), busauth.Grant{Role: busauth.Supervisor, Sandbox: sandbox})
		if err != nil {
			return nil, err
		}
		opts = append(opts, u.Options()...)
	}
	return nats.Connect(url, opts...)
}
