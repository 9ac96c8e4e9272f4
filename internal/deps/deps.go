package deps

import (
	_ "github.com/cedar-policy/cedar-go"
	_ "github.com/go-chi/chi/v5"
	_ "github.com/gowebpki/jcs"
	_ "github.com/lestrrat-go/jwx/v2/jws"
	_ "github.com/open-policy-agent/opa/v1/rego"
	_ "github.com/santhosh-tekuri/jsonschema/v6"
	_ "go.etcd.io/etcd/client/v3"
	_ "go.etcd.io/etcd/server/v3/embed"
	_ "go.uber.org/goleak"
	_ "sigs.k8s.io/yaml"
)
