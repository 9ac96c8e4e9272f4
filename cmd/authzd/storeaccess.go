package main

import "github.com/fcd-authz/fcd/lease"

// storeAccess is how every client of fcd's store reaches it, serve and
// each command that talks to etcd (server.Config.StoreAccess, the one
// place it is decided, as the /readyz access check, server's accessWatch).
func (c *Config) storeAccess() (lease.ClientAccess, error) { return c.server(nil, nil).StoreAccess() }
