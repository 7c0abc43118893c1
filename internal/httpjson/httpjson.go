// Package httpjson writes the JSON answers of gpulet's HTTP servers (gpuletd's
// API and the collector): one body shape for errors, mapped from the error
// vocabulary of package api in one place, and a newline after every answer.
package httpjson

import (
	"encoding/json"
	"net/http"

	"github.com/gpulet/gpulet/api"
)

var newline = []byte{'\n'}

// Write answers with status and v encoded.
func Write(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	WriteEncoded(w, status, b)
	return nil
}

// WriteEncoded answers with status and b, JSON already encoded.
func WriteEncoded(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
	w.Write(newline)
}

// Error answers with err as status and {"error":{"code","message"}}. An error
// that maps to no code of the vocabulary is a 500, which internal is told of
// (to log it) first.
func Error(w http.ResponseWriter, err error, internal func(error)) {
	status, code := api.StatusOf(err)
	if status == http.StatusInternalServerError && internal != nil {
		internal(err)
	}
	Write(w, status, api.ErrorBody{Error: api.ErrorDetail{Code: code, Message: err.Error()}})
}
