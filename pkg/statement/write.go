package statement

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// FOCUSVersion is the FinOps Open Cost and Usage Specification whose column
// names the CSV uses.
const FOCUSVersion = "1.2"

// Columns are the CSV's columns: FOCUS names, in this order.
var Columns = []string{
	"BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd", "ChargeCategory",
	"BilledCost", "EffectiveCost", "ListCost", "BillingCurrency",
	"ConsumedQuantity", "ConsumedUnit", "PricingQuantity", "PricingUnit", "ListUnitPrice",
	"ResourceId", "ResourceName", "ResourceType", "ServiceName", "SubAccountId", "SubAccountName", "Tags",
	// Custom columns (FOCUS has none for use): ConsumedQuantity split by
	// the devices' use, in GPU-unit-hours, and what the idle part cost.
	"x_UsedQuantity", "x_IdleQuantity", "x_UnknownUseQuantity", "x_IdleCost",
}

// ServiceName is the FOCUS ServiceName of every row.
const ServiceName = "GPU as a Service (gpuaas-dra)"

// Unit is the consumed and pricing unit: one GPU unit held for an hour.
const Unit = "GPU-unit-hour"

// WriteText prints the statement for a person: one line per profile (or
// shape), GPU model and price, and the total.
func WriteText(w io.Writer, s Statement) error {
	if _, err := fmt.Fprintf(w, "Statement of tenant %s for %s (%s to %s UTC), as of %s\n", s.Tenant, s.Period,
		s.Start.Format(time.DateOnly), s.End.Add(-time.Second).Format(time.DateOnly), s.AsOf.Format(time.RFC3339)); err != nil {
		return err
	}
	// The tabwriter buffers until Flush, which returns the writer's error.
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	_, _ = fmt.Fprintf(tw, "KIND\tNAME\tGPU MODEL\tPRICE/UNIT-HOUR\tGPU-UNIT-HOURS\tUSED\tIDLE\tUNKNOWN USE\tCOST\tIDLE COST\tRECORDS\tOPEN\n")
	for _, l := range s.Lines {
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", l.Kind, l.Name, orDash(l.GpuModel), priceString(l.Price),
			hours(l.UnitSeconds), hours(l.Used), hours(l.Idle), hours(l.UnknownUse), money(l.Cost), money(l.IdleCost), l.Records, l.Open)
	}
	_, _ = fmt.Fprintf(tw, "TOTAL\t\t\t\t%s\t%s\t%s\t%s\t%s %s\t%s %s\t\t\n", hours(s.UnitSeconds), hours(s.Used), hours(s.Idle),
		hours(s.UnknownUse), money(s.Cost), s.Currency, money(s.IdleCost), s.Currency)
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteCSV writes the statements as CSV with FOCUS-named columns (header
// first): a row per line of each. Times are RFC 3339 UTC; the charge
// period of a period still running ends at its latest observation.
func WriteCSV(w io.Writer, statements ...Statement) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(Columns); err != nil {
		return fmt.Errorf("writing the CSV header: %w", err)
	}
	for _, s := range statements {
		for _, l := range s.Lines {
			tags, err := json.Marshal(map[string]any{
				"gpuaas.io/period": s.Period, "gpuaas.io/gpu-model": l.GpuModel,
				"gpuaas.io/records": l.Records, "gpuaas.io/open-records": l.Open, "gpuaas.io/uncertain-records": l.Uncertain,
			})
			if err != nil {
				return fmt.Errorf("encoding tags: %w", err)
			}
			cost, qty := money(l.Cost), hours(l.UnitSeconds)
			row := []string{
				s.Start.Format(time.RFC3339), s.End.Format(time.RFC3339), s.Start.Format(time.RFC3339), s.AsOf.Format(time.RFC3339), "Usage",
				cost, cost, cost, s.Currency,
				qty, Unit, qty, Unit, priceString(l.Price),
				resourceID(s.Tenant, l), l.Name, l.Kind, ServiceName, s.Tenant, s.Tenant, string(tags),
				hours(l.Used), hours(l.Idle), hours(l.UnknownUse), money(l.IdleCost),
			}
			if err := cw.Write(row); err != nil {
				return fmt.Errorf("writing a CSV row: %w", err)
			}
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("writing the CSV: %w", err)
	}
	return nil
}

// resourceID names what a row charges: the tenant's use of a profile (or
// shape); the GPU model and the price are in the row's other columns.
func resourceID(tenant string, l Line) string {
	kind := "gpuprofiles"
	if l.Kind == "GpuShape" {
		kind = "gpushapes"
	}
	return fmt.Sprintf("gpuaas.io/tenants/%s/%s/%s", tenant, kind, l.Name)
}
