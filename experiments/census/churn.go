// churn.go - a Go program that allocates and frees heavily, for the census:
// for SECONDS, GOMAXPROCS goroutines each build maps and slices of 64 B to
// 1 MiB, keep a rotating window of them alive and drop the rest, so the
// collector runs hundreds of times and the scavenger returns memory to the
// kernel.  It prints the collector's counts.
//
//	churn SECONDS
package main

import (
	"fmt"
	"math/rand"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"
)

func worker(id int, end time.Time, wg *sync.WaitGroup) {
	defer wg.Done()
	rnd := rand.New(rand.NewSource(int64(id)))
	kept := make([][]byte, 2048)
	for time.Now().Before(end) {
		for i := 0; i < 1000; i++ {
			b := make([]byte, 64<<rnd.Intn(15))
			b[0] = byte(i)
			if i%4 == 0 {
				kept[rnd.Intn(len(kept))] = b
			}
			if i%100 == 0 {
				m := make(map[int]string, 256)
				for k := 0; k < 256; k++ {
					m[k] = strconv.Itoa(k)
				}
			}
		}
	}
}

func main() {
	seconds, _ := strconv.ParseFloat(os.Args[1], 64)
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	var wg sync.WaitGroup
	for i := 0; i < runtime.GOMAXPROCS(0)*2; i++ {
		wg.Add(1)
		go worker(i, end, &wg)
	}
	wg.Wait()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("gc_cycles=%d heap_released_mib=%d heap_sys_mib=%d\n", ms.NumGC,
		ms.HeapReleased>>20, ms.HeapSys>>20)
}
