package service

// BypassWarning is what operators are told when CRI pulls skip the transfer
// service.
const BypassWarning = "CRI pulls bypass the transfer service (use_local_image_pull is set, " +
	"or a CRI image option that only the local pull path supports is configured; containerd's log names it): " +
	"Pullwise pull features (pull source, node-wide pull limit, dedupe, progress, IfNewerNotPresent) do not apply to CRI pulls"
