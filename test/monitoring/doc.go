// Package monitoring holds the tests of the chart's monitoring mixin
// (deployments/helm/gpuaas-dra/monitoring): every dashboard query and rule
// expression names only metrics and labels the binaries register, the rules
// pass promtool's checks and unit tests, and the chart renders the
// dashboards, rules and scrape objects when monitoring is enabled. See
// docs/monitoring.md.
package monitoring
