// Command pause blocks until SIGTERM or SIGINT and then exits 0. The
// integration tests build it statically and put it in test images as the
// sandbox (pause) process and as a container that keeps running, so pods
// run with no image from the internet. It lives under testdata to stay out
// of ./... .
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	fmt.Println("pause: running")
	s := <-sig
	fmt.Printf("pause: %v, exiting\n", s)
}
