package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/torpor/torpor/events"
)

// exitStatuses is the exit status of torpor for each contract code
// (CONTRACT §2) of the error it ends with: the one table that run, the
// text of `torpor --help` and the README's table come from (a test checks
// both against it). 0 is success; a code not in it (none today) is 1, as
// INTERNAL is.
var exitStatuses = map[events.Code]int{
	events.CodeInternal:           1,
	events.CodeInvalidArgument:    2,
	events.CodeNotFound:           3,
	events.CodeFailedPrecondition: 4,
	events.CodeAlreadyExists:      5,
	events.CodeAborted:            6,
	events.CodeUnavailable:        7,
	events.CodeDeadlineExceeded:   8,
	events.CodeUnimplemented:      9,
	events.CodeUnauthenticated:    10,
	events.CodePermissionDenied:   10,
	events.CodeResourceExhausted:  11,
}

// exitStatus is the exit status of an error of code c.
func exitStatus(c events.Code) int {
	if s, ok := exitStatuses[c]; ok {
		return s
	}
	return 1
}

// exitRows are the rows of the exit status table, by status: the status
// and the codes that end with it.
func exitRows() []exitRow {
	by := map[int][]string{}
	for c, s := range exitStatuses {
		by[s] = append(by[s], string(c))
	}
	rows := []exitRow{{0, []string{"success"}}}
	for s, cs := range by {
		slices.Sort(cs)
		if s == 1 {
			cs = append(cs, "an error without a code")
		}
		rows = append(rows, exitRow{s, cs})
	}
	slices.SortFunc(rows, func(a, b exitRow) int { return cmp.Compare(a.status, b.status) })
	return rows
}

type exitRow struct {
	status int
	codes  []string
}

// exitHelp is the exit status table as `torpor --help` prints it.
func exitHelp() string {
	var b strings.Builder
	b.WriteString("Exit status: 0 on success; on an error, \"torpor: CODE: message\" on stderr and\nthe status of its code (CONTRACT §2):\n")
	for _, r := range exitRows() {
		fmt.Fprintf(&b, "  %2d  %s\n", r.status, strings.Join(r.codes, ", "))
	}
	return b.String()
}
