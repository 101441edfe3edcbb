package events

import (
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// ErrForeign: a message on a sandbox's subject is not a torpor event this
// build can read. Any NATS client may publish there; every reader skips such
// a message (CONTRACT §4) and it never changes a sandbox.
var ErrForeign = errors.New("not a torpor event")

// Vet reports why env, decoded from a message on sandbox id's subject whose
// type header is typ, is not a torpor event this build can read (an error
// wrapping ErrForeign), or nil. It asks for a type header that names a
// registered type and agrees with the body, a schema this build reads, the
// sandbox id of the subject, which must be one (ValidID: no reader ever
// makes a phantom sandbox of torpor.sandbox.ZZ), and an event id. It does not decode the event's
// data: a reader that decodes it skips an event whose data does not fit its
// type the same way (see Envelope.Decode).
func Vet(env Envelope, id, typ string) error {
	switch {
	case typ == "":
		return fmt.Errorf("%w: no type header", ErrForeign)
	case typ != env.Type:
		return fmt.Errorf("%w: type header %q, body type %q", ErrForeign, typ, env.Type)
	case !Known(env.Type):
		return fmt.Errorf("%w: unknown type %q", ErrForeign, env.Type)
	case env.Schema < 1 || env.Schema > SchemaVersion:
		return fmt.Errorf("%w: schema %d, this build reads 1 to %d", ErrForeign, env.Schema, SchemaVersion)
	case env.SandboxID != id:
		return fmt.Errorf("%w: sandbox %q on the subject of %q", ErrForeign, env.SandboxID, id)
	case !ValidID(id):
		return fmt.Errorf("%w: %q is not a sandbox id (a lower-case uuid)", ErrForeign, id)
	case env.ID == "":
		return fmt.Errorf("%w: no event id", ErrForeign)
	}
	return nil
}

// ValidID reports whether id is a sandbox id: a uuid in its canonical
// lower-case form, as the gateway mints them.
func ValidID(id string) bool {
	u, err := uuid.Parse(id)
	return err == nil && u.String() == id
}
