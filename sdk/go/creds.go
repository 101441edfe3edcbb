package torpor

import (
	"os"

	"github.com/nats-io/nats.go"

	"github.com/torpor/torpor/internal/busauth"
)

// Credentials connects as the user of a credentials file that `torpor creds`
// wrote: nats.UserCredentials(path), and, for a producer or dashboard, the
// inbox prefix that user must read its answers on (each client has one of
// its own, which no other client may read). Pass it to nats.Connect:
//
//	nc, err := nats.Connect(url, torpor.Credentials("client.creds"))
func Credentials(path string) nats.Option {
	return func(o *nats.Options) error {
		if err := nats.UserCredentials(path)(o); err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		inbox, err := busauth.CredsInbox(b)
		if err != nil || inbox == "" {
			return err
		}
		return nats.CustomInboxPrefix(inbox)(o)
	}
}
