package kvview

import (
	"reflect"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
)

// nonZero sets f, a settable field, to a value other than its zero one, or
// says it does not know how.
func nonZero(t *testing.T, f reflect.Value) {
	t.Helper()
	switch {
	case f.Type() == reflect.TypeOf(time.Time{}):
		f.Set(reflect.ValueOf(time.Date(2026, 12, 6, 17, 0, 0, 0, time.FixedZone("x", 3600))))
		return
	}
	switch f.Kind() {
	case reflect.String:
		f.SetString("x")
	case reflect.Bool:
		f.SetBool(true)
	case reflect.Int, reflect.Int64:
		f.SetInt(7)
	case reflect.Uint64:
		f.SetUint(7)
	case reflect.Pointer:
		f.Set(reflect.New(f.Type().Elem()))
		nonZero(t, f.Elem())
	case reflect.Map:
		f.Set(reflect.MakeMap(f.Type()))
	case reflect.Slice:
		f.Set(reflect.MakeSlice(f.Type(), 1, 1))
		nonZero(t, f.Index(0))
	case reflect.Struct:
		nonZero(t, f.Field(0))
	default:
		t.Fatalf("a field of kind %s: teach nonZero to set it", f.Kind())
	}
}

// leaves are the paths (field indexes) of the fields of a view, each
// struct field but time.Time's taken apart into its own.
func leaves(typ reflect.Type, prefix []int) [][]int {
	var out [][]int
	for i := range typ.NumField() {
		f := typ.Field(i)
		path := append(append([]int{}, prefix...), i)
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Time{}) {
			out = append(out, leaves(f.Type, path)...)
			continue
		}
		out = append(out, path)
	}
	return out
}

// TestPackKeepsEveryField: the cache gives back the view it was given,
// whichever of its fields is set, alone or all at once; a field added to
// events.View that packed neither keeps inline nor counts in plain fails
// here (checked: with plain not looking at Idle, the Idle.After case
// failed).
func TestPackKeepsEveryField(t *testing.T) {
	all := events.View{}
	for _, path := range leaves(reflect.TypeOf(all), nil) {
		var v events.View
		nonZero(t, reflect.ValueOf(&v).Elem().FieldByIndex(path))
		nonZero(t, reflect.ValueOf(&all).Elem().FieldByIndex(path))
		name := reflect.TypeOf(v).FieldByIndex(path).Name
		t.Run(name, func(t *testing.T) {
			e := entry{view: v, rev: 3}
			if got := pack(e).entry(); !reflect.DeepEqual(got, e) {
				t.Errorf("pack(%+v).entry() = %+v, want it back", e, got)
			}
		})
	}
	e := entry{view: all, rev: 9}
	if got := pack(e).entry(); !reflect.DeepEqual(got, e) {
		t.Errorf("pack of a view with every field set: got %+v, want %+v", got, e)
	}
}

// TestPackPlainViewInline: a sandbox without policies or forwards (most of
// a fleet) is cached without a whole view beside its fields.
func TestPackPlainViewInline(t *testing.T) {
	code := 0
	now := time.Now()
	for _, tc := range []struct {
		name string
		view events.View
		rest bool
	}{
		{"ready", events.View{ID: "a", Name: "n", Phase: events.PhaseReady, Generation: 2, Driver: "sim", Node: "local",
			Labels: map[string]string{}, UpdatedAt: now, Seq: 9, PhaseSince: now, LastActiveAt: now, LastOutcome: events.OutcomeRestored}, false},
		{"stopped", events.View{ID: "a", Phase: events.PhaseStopped, ExitCode: &code, Restore: events.Restore{Held: true, Consumed: true}}, false},
		{"idle policy", events.View{ID: "a", Idle: events.IdlePolicy{After: "5m"}}, true},
		{"forwards", events.View{ID: "a", Forwards: []events.Forward{{ID: "f"}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pack(entry{view: tc.view}).rest != nil; got != tc.rest {
				t.Errorf("packed with the whole view = %v, want %v", got, tc.rest)
			}
		})
	}
}
