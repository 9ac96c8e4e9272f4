package server_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"

	"github.com/fcd-authz/fcd/server"
)

// ExampleNew builds the server as `authzd serve` does, from files, serves
// until SIGINT or SIGTERM, then shuts down gracefully and closes it. The
// zero fields are the Default… values: the embedded etcd member in
// fcd-data, HTTP on 127.0.0.1:8080, the embedded default policies.
func ExampleNew() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	s, err := server.New(ctx, server.Config{
		RegistrarKeys: "keys/registrars.jwks",
		Credentials:   "credentials.json",
		SigningKey:    "keys/dispatch.jwk",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	log.Printf("listening on %s", s.URL())
	if err := s.Run(ctx); err != nil {
		log.Print(err)
	}
}
