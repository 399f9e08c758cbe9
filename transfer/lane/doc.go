// Package lane orders the work that a node's pulls share: the gate's pull
// slots (transfer/gate), blob downloads and the link (Link, download
// places), layer unpacking and the CPUs (Applier, Pacer), and the writes
// to containerd's metadata database (transfer/commits, a Lane of one).
//
// containerd shares all of these by arrival, one layer at a time, so a
// burst of pulls shares them evenly and every image is done at about the
// same time, late. This package serves instead the pull that would be done
// first, and bounds how long any pull can be passed over, so that the
// first pods start early and the last no later than with even sharing.
//
// One model, in these words:
//
//   - cost: what a pull's layers take to write on this node, learned per
//     media type from the layers it has written (Costs). It can be wrong
//     several times over, since what a byte costs to write depends on
//     what the layers hold, not only on their compression; lateness
//     (below) bounds what a wrong cost can do to a pull. A pull is priced
//     once: re-priced by its layers' pace as they were written, a
//     burst's median image came later in an A/B
//     (docs/benchmarks-history.md).
//   - due: when a pull should be done: when it was asked for, plus its
//     cost (Ticket). Every line here is ordered by due, earliest first;
//     between equal dues, by arrival. A pull whose cost is not known yet
//     is due when it was asked for.
//   - ahead: due more than the Slack before another. Only work ahead
//     overtakes or makes others give way (below). Between pulls within
//     the slack of each other, a line still serves the earlier due first,
//     but nothing that holds a place is passed or paused for it.
//   - overtake: work ahead of everything holding a place does not wait
//     for them: it takes an extra place beyond the limit, up to the limit
//     more (Extra). A place is held for a whole layer, tens of seconds for
//     a large one; a small pull asked for with it would wait that long for
//     a CPU the operating system would share.
//   - give way: a body on the link, or a layer being written, pauses while
//     work ahead of it uses what it would (Flow.Behind, Pacer): a body
//     while a body ahead arrives, a layer while layers ahead fill every
//     place, and either while a pull ahead is in flight and tasks on the
//     node wait for a CPU (InFlight, Pressure). That last sees the work
//     the lanes do not order (the runtime starting pods, a loopback
//     registry), and no pause leaves a CPU idle: each needs the work
//     ahead to fill the places, or the kernel to say someone waits. A
//     body that would give way is not asked for until it would not
//     (Link.Unasked): the place it gives back is for the work ahead. A
//     layer holds its place while it pauses, so it pauses only while no
//     work ahead of it waits for a place: that work would wait on the
//     pause.
//   - early: a layer written while its blob arrives (transfer/early) only
//     moves earlier what would otherwise run after its last byte, so it
//     gives way to every pull ahead in flight, whatever the pressure:
//     before it asks for a place (InFlight.Yield) and while it is written
//     (Pacer, WrittenEarly). Its waits for bytes teach Costs nothing.
//   - late: a pull past its due has waited as long as it takes. It is no
//     longer passed over: it takes an extra place when one is left, and
//     gives way to nobody. This bounds the tail: a pull waits for others
//     at most about its own cost, then runs beside them, so the largest
//     image of a burst is not left to start after everything else.
//   - lend: a pull holding a lock that an earlier-due pull waits on (the
//     lock on a blob or a layer's chain that both images share,
//     KeyedLock) is due as early as that pull while it holds it, so the
//     waiter is not held up behind work due before the holder (priority
//     inheritance). The lent due moves the holder's work waiting in the
//     lines it does under the lock (unpack places, write turns) up, and
//     keeps its layers and bodies from giving way. The layer written
//     under the lock waited on (Guards: containerd's unpacker takes a
//     chain's lock before it prepares the layer's snapshot) goes by the
//     waiter's own due in the unpack lane as by its own, but for lateness
//     (Ticket.OwnDueUnder): it takes an extra place by it, and others'
//     layers count it among the work ahead. The holder's other work goes
//     by its own due: lateness, extra places, and whom other work gives
//     way to or passes. Lent to
//     the whole pull, any layer of a large image could take an extra
//     place while a small pull waited on its lock, and the small pulls
//     came later (an A/B in docs/benchmarks-history.md); lent to none, the
//     layer the small pull waits for could wait for a place behind the
//     large image's own layers. Download places are not told, untried.
//
// A priority queue is written here because no semaphore in the standard
// library or golang.org/x/sync orders its waiters by anything but arrival.
package lane
