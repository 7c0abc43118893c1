package server

import (
	"os"
	"strconv"
)

func readProcStatus(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	return string(b), err
}
