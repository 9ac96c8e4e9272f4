package authz

// tracerScope is the instrumentation scope of the use cases' spans
// (internal/tracing: started only below a traced request).
const tracerScope = "github.com/fcd-authz/fcd/authz"
