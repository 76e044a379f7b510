// Package webhookcert is the dra-controller's webhook certificates: the
// self-signed CA and serving certificate a single process makes for itself
// (Ensure), and, with the chart, the certificate Secret every replica
// shares, kept by open-policy-agent's cert-controller and served from
// memory as it changes (Served, SetupRotation; the rotator also keeps the
// CA bundle of the chart's webhook configurations). The webhook
// configurations the controller writes itself, and the handlers, are
// pkg/controller's.
package webhookcert
