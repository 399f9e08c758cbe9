package service

import "strings"

// BypassWarning is what operators are told when CRI pulls skip Pullwise's
// transfer service; options are the CRI image options that send CRI down
// its local pull path.
func BypassWarning(options []string) string {
	why := "a CRI image option only its local pull path supports"
	if len(options) > 0 {
		why = strings.Join(options, ", ")
	}
	return "CRI pulls bypass the transfer service (" + why + ") and Pullwise's cri-pull interceptor is not serving them: " +
		"Pullwise pull features (pull source, node-wide pull limit, dedupe, progress, IfNewerNotPresent) do not apply to CRI pulls"
}
