package jsstore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events/natserr"
)

// Sandboxes lists the id of every sandbox the log holds a message for:
// the subjects torpor.sandbox.<id> of the stream, read from the stream's
// own subject list, not from a view (torpor check enumerates them so).
// Ids are uuid v7, so their order is their creation's.
func (s *Store) Sandboxes(ctx context.Context) ([]string, error) {
	info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter(SubjectPrefix+">"))
	if err != nil {
		return nil, natserr.Unavailable(fmt.Errorf("list the log's subjects: %w", err))
	}
	ids := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		if id, ok := strings.CutPrefix(subj, SubjectPrefix); ok && id != "" {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}
