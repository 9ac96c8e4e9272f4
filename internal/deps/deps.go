package deps
import (
 _ "github.com/open-policy-agent/opa/v1/rego"
 _ "github.com/cedar-policy/cedar-go"
 _ "go.etcd.io/etcd/client/v3"
 _ "go.etcd.io/etcd/server/v3/embed"
 _ "github.com/go-chi/chi/v5"
 _ "github.com/lestrrat-go/jwx/v2/jws"
 _ "github.com/gowebpki/jcs"
 _ "github.com/santhosh-tekuri/jsonschema/v6"
 _ "sigs.k8s.io/yaml"
 _ "go.uber.org/goleak"
)
