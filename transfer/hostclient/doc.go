// Package hostclient is the HTTP client of one registry host in one pull:
// the transport containerd's resolver uses for each host that hosts.toml
// lists. It is where a pull meets the node's shared state:
//
//   - the host-health table (transfer/health): a host marked down is
//     skipped while a later host may be used, a 429's Retry-After is
//     honoured, and a host that does not answer, or stops sending, is cut
//     off after the table's timeouts;
//   - the download lane (transfer/lane): a blob GET holds a download place
//     from its request until its body is in its last round trip (place.go),
//     and with the link, a body pauses while a pull due sooner downloads
//     (body.go);
//   - the registry's token service: each host's authorizer starts afresh
//     after a failed token fetch (authorizer.go).
//
// What each host answered is told to an Observer; transfer/source records
// it for the pull's source labels and its failure message. The package
// knows nothing of pulls beyond that.
package hostclient
