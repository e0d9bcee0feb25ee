// Package inspect reaches the engine inside a server.Server, for the
// repository's own tests and benchmarks. The server package registers the
// accessor at init, so the engine, an internal type, appears in no public
// signature.
package inspect

import "github.com/sluice-dev/sluice/internal/engine"

var engineOf func(srv any) *engine.Engine

// Register sets the accessor; the server package calls it once, at init.
func Register(f func(srv any) *engine.Engine) { engineOf = f }

// Engine returns the engine of srv, a *server.Server.
func Engine(srv any) *engine.Engine { return engineOf(srv) }
