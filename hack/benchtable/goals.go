package main

// Issue 39's goals, as Pullwise / stock or as a multiple of the burst's
// bound. A cell over its goal is a miss, printed in bold.
const (
	firstGoal       = 0.6  // the first image or pod
	medianGoal      = 0.75 // the median image or pod
	lastGoal        = 0.95 // the last pod (kubelet) or the burst's makespan (CRI)
	smallMedianGoal = 0.5  // the small images' median beside a big one
	delayMedianGoal = 0.5  // kubelet's pull delay over the images-present floor, at the median

	medianBoundGoal = 1.3 // a CRI burst's median against its bound
	// A CRI burst's makespan against its bound, per profile.
	makespanBoundLoopback = 1.25
	makespanBoundWAN      = 1.2
)

// makespanBoundGoal is the makespan goal for a profile.
func makespanBoundGoal(profile string) float64 {
	if profile == "wan" {
		return makespanBoundWAN
	}
	return makespanBoundLoopback
}
