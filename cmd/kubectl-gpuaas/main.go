// Command kubectl-gpuaas is a kubectl plugin (installed on the PATH,
// `kubectl gpuaas ...`) for tenant admins of the gpu.gpuaas.io service. Its
// one subcommand, statement, prints a tenant's usage and cost of a UTC
// month per profile from the TenantUsage the controller keeps, or writes
// it as CSV with FOCUS-named columns (docs/platform.md, "Statements").
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/statement"
)

const usage = `Usage: kubectl gpuaas statement [--tenant NAME] [--period YYYY-MM] [--csv] [--kubeconfig PATH] [--context NAME]

statement prints a tenant's usage and cost of one UTC month (the current one
by default) per GpuProfile or GpuShape, GPU model and price, from the
TenantUsage the dra-controller keeps. Without --tenant, every tenant with
usage in the period. --csv writes CSV with FOCUS ` + statement.FOCUSVersion + ` column names.

Who may read it: the cluster's admins, and the readers a platform admin
lists in the tenant's TenantQuota (spec.billing.readers: users, groups or
ServiceAccounts, such as the tenant's namespace admins). Readers get their
own tenant's TenantUsages only, and list none: they pass --tenant.
`

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kubectl-gpuaas:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] != "statement" {
		fmt.Fprint(os.Stderr, usage)
		return fmt.Errorf("want the subcommand statement")
	}
	fs := pflag.NewFlagSet("statement", pflag.ContinueOnError)
	tenant := fs.String("tenant", "", "the TenantQuota's name (default: every tenant with usage in the period)")
	period := fs.String("period", time.Now().UTC().Format("2006-01"), "the UTC month, YYYY-MM")
	asCSV := fs.Bool("csv", false, "write CSV with FOCUS column names")
	kubeconfig := fs.String("kubeconfig", "", "the kubeconfig (default: $KUBECONFIG or ~/.kube/config)")
	kubeContext := fs.String("context", "", "the kubeconfig context")
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage); fs.PrintDefaults() }
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if _, err := time.Parse("2006-01", *period); err != nil {
		return fmt.Errorf("--period %q: want YYYY-MM", *period)
	}
	c, err := newClient(*kubeconfig, *kubeContext)
	if err != nil {
		return err
	}
	usages, err := statement.Read(ctx, c, *tenant, *period)
	if err != nil {
		return err
	}
	return write(out, usages, *asCSV)
}

func newClient(kubeconfig, kubeContext string) (client.Client, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := gpuaas.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating the client: %w", err)
	}
	return c, nil
}

func write(out io.Writer, usages []gpuaas.TenantUsage, asCSV bool) error {
	statements := make([]statement.Statement, 0, len(usages))
	for i := range usages {
		statements = append(statements, statement.FromUsage(&usages[i]))
	}
	if asCSV {
		return statement.WriteCSV(out, statements...)
	}
	if len(statements) == 0 {
		_, err := fmt.Fprintln(out, "No usage recorded in the period.")
		return err
	}
	for i, s := range statements {
		if i > 0 {
			if _, err := fmt.Fprintln(out); err != nil {
				return err
			}
		}
		if err := statement.WriteText(out, s); err != nil {
			return err
		}
	}
	return nil
}
