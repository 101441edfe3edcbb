// Package compute is the contract between torpor and the machines that run
// sandboxes: the Driver interface the sagas call, the capability flags the
// gateway checks before accepting a command, supervisor generations and their
// credentials, and the reports supervisors send on torpor.supervisor.<id>.
// In-tree drivers live in subpackages (sim).
package compute
