// CoreDNS with only the plugins the local cluster's Corefile names (see
// stateward_local.nodes.daemons.corefile): upstream's main links every plugin, and their
// cloud SDKs (Route 53, Azure, Cloud DNS, tracing) doubled the cold compile (about 300 CPU
// seconds against 185 here). CoreDNS documents this way of choosing plugins at compile time.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

// The order in which the plugins see a query, as in upstream's plugin.cfg.
var directives = []string{"bind", "errors", "kubernetes", "cache"}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
