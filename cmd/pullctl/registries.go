package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

// registryJSON is one host in `registries -o json`: times as RFC 3339 and
// counts as JSON numbers, for scripts.
type registryJSON struct {
	Host        string            `json:"host"`
	Kind        string            `json:"kind"`
	Serves      []string          `json:"serves,omitempty"`
	State       string            `json:"state"`
	Since       string            `json:"since,omitempty"`
	LastError   string            `json:"lastError"`
	LastErrorAt string            `json:"lastErrorAt,omitempty"`
	NextProbe   string            `json:"nextProbe,omitempty"`
	RetryAt     string            `json:"retryAt,omitempty"`
	Failures    int32             `json:"failures"`
	Requests    map[string]uint64 `json:"requests"`
}

func registriesCommand() *cli.Command {
	return &cli.Command{
		Name:  "registries",
		Usage: "list registry hosts the node's pulls have used and their health",
		Flags: []cli.Flag{outputFlag()},
		Action: withClient(func(ctx context.Context, cmd *cli.Command, c *client) error {
			resp, err := c.pullwise.ListRegistries(ctx, &api.ListRegistriesRequest{})
			if err != nil {
				return c.explain("list registries", err)
			}
			if cmd.String("output") == "json" {
				out := struct {
					Hosts []registryJSON `json:"hosts"`
				}{Hosts: []registryJSON{}}
				for _, h := range resp.GetHosts() {
					out.Hosts = append(out.Hosts, registryJSON{
						Host: h.GetHost(), Kind: h.GetKind(), Serves: h.GetServes(), State: h.GetState(), Since: rfc3339(h.GetSince()),
						LastError: h.GetLastError(), LastErrorAt: rfc3339(h.GetLastErrorAt()),
						NextProbe: rfc3339(h.GetNextProbe()), RetryAt: rfc3339(h.GetRetryAt()),
						Failures: h.GetFailures(), Requests: h.GetRequests(),
					})
				}
				return printJSON(cmd.Root().Writer, out)
			}
			now := time.Now()
			w := newTable(cmd.Root().Writer)
			fmt.Fprintln(w, "HOST\tKIND\tSTATE\tSINCE\tNEXT PROBE\tLAST ERROR")
			for _, h := range resp.GetHosts() {
				next := "-"
				switch {
				case h.GetNextProbe() != 0:
					next = "in " + time.Unix(0, h.GetNextProbe()).Sub(now).Round(time.Second).String()
				case h.GetRetryAt() != 0:
					// A throttled host: up, but not asked before it said.
					next = "retry in " + time.Unix(0, h.GetRetryAt()).Sub(now).Round(time.Second).String()
				}
				kind := h.GetKind()
				if len(h.GetServes()) > 0 {
					kind += " of " + strings.Join(h.GetServes(), ",")
				}
				lastErr := "-"
				if h.GetLastError() != "" {
					lastErr = fmt.Sprintf("%s (%s ago)", h.GetLastError(), ago(now, h.GetLastErrorAt()))
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s ago\t%s\t%s\n", h.GetHost(), kind, h.GetState(), ago(now, h.GetSince()), next, lastErr)
			}
			return w.Flush()
		}),
	}
}

func rfc3339(nanos int64) string {
	if nanos == 0 {
		return ""
	}
	return time.Unix(0, nanos).UTC().Format(time.RFC3339Nano)
}

func ago(now time.Time, nanos int64) string {
	return now.Sub(time.Unix(0, nanos)).Round(time.Second).String()
}
