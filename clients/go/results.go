package timeshard

// A job's result: how the worker encodes what a handler returned (as the Python worker's
// src/timeshard/worker/returns.py does), the traceback it sends with a failure, and how a client
// reads a finished job's result back.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxResultBytes is the largest result a job keeps (the server's limit, 256 KiB): a handler's
// result over it fails the attempt permanently.
const MaxResultBytes = 256 * 1024

// maxTracebackBytes: a traceback is cut to its last this many bytes (the server keeps no more).
const maxTracebackBytes = 8000

// The result encodings of Job.ResultEncoding ("" is no result).
const (
	ResultJSON  = "json"
	ResultBytes = "bytes"
)

// resultError is a handler's return value that can not be stored as its job's result. The
// attempt fails permanently: the handler's effects have happened, and a retry would repeat
// them for the same unstorable value. Its text starts "ResultError:" as the Python worker's
// and the server's refusals do, so a dead letter reads the same whichever SDK ran it.
type resultError struct{ why string }

func (e *resultError) Error() string { return "ResultError: " + e.why }

// encodeResult is the result and its encoding for a handler's return value: nil is no result,
// a []byte is stored as it is ("bytes"), anything else as compact JSON ("json"; a
// json.RawMessage is JSON already). A value json.Marshal refuses, one whose MarshalJSON
// panics, or a result over MaxResultBytes is a *resultError.
func encodeResult(value any) (data []byte, encoding string, err error) {
	switch v := value.(type) {
	case nil:
		return nil, "", nil
	case []byte:
		data, encoding = v, ResultBytes
	default:
		if data, err = marshalJSON(value); err != nil {
			return nil, "", &resultError{fmt.Sprintf(
				"the handler returned a %T that is not JSON-serialisable (%v); return JSON-serialisable data, []byte or nil",
				value, err)}
		}
		encoding = ResultJSON
	}
	if len(data) > MaxResultBytes {
		return nil, "", &resultError{fmt.Sprintf(
			"the handler's result is %d bytes, over the limit of %d bytes; keep large output elsewhere and return a reference to it",
			len(data), MaxResultBytes)}
	}
	return data, encoding, nil
}

// marshalJSON is value as compact JSON with <, > and & as they are (as Python's json.dumps
// writes them), and a panic of a MarshalJSON method as an error.
func marshalJSON(value any) (data []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("its JSON encoding panicked: %v", p)
		}
	}()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(value); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// tracebackOf is what a returned error sends as its attempt's traceback: its "%+v" form when
// that says more than its text (errors that carry a stack print it so), else nothing. A
// PermanentError is looked through, since it does not format its error's stack itself.
func tracebackOf(err error) string {
	var permanent *PermanentError
	if errors.As(err, &permanent) && permanent.Err != nil {
		err = permanent.Err
	}
	if detailed := fmt.Sprintf("%+v", err); detailed != err.Error() {
		return truncateTraceback(detailed)
	}
	return ""
}

// truncateTraceback keeps a traceback's last maxTracebackBytes (the end names the error and
// where it was raised), at a character boundary, saying so at the start, as the Python SDK
// does.
func truncateTraceback(text string) string {
	if len(text) <= maxTracebackBytes {
		return text
	}
	note := fmt.Sprintf("(truncated from %d bytes) ...\n", len(text))
	start := len(text) - (maxTracebackBytes - len(note))
	for start < len(text) && !utf8.RuneStart(text[start]) {
		start++
	}
	return note + text[start:]
}

// ErrNoResult is the cause of DecodeResult's error for a job without a result: not succeeded
// (yet), or its handler returned nil.
var ErrNoResult = errors.New("timeshard: the job has no result")

// DecodeResult reads a finished job's JSON result into v, as json.Unmarshal does. A job
// without a result is an error wrapping ErrNoResult; a job whose handler returned []byte
// (ResultEncoding "bytes") is an error as well: read those from job.GetResult().
//
//	job, err := client.Wait(ctx, id, time.Minute)
//	var sum struct{ Total int }
//	err = timeshard.DecodeResult(job, &sum)
func DecodeResult(job *Job, v any) error {
	if job == nil {
		return errors.New("timeshard: DecodeResult of a nil job")
	}
	switch enc := job.GetResultEncoding(); enc {
	case ResultJSON:
		if err := json.Unmarshal(job.GetResult(), v); err != nil {
			return fmt.Errorf("timeshard: job %s: decoding its JSON result: %w", job.GetJobId(), err)
		}
		return nil
	case "":
		return fmt.Errorf("%w: job %s is %s; only a succeeded job whose handler returned a value has one",
			ErrNoResult, job.GetJobId(), stateName(job.GetState()))
	case ResultBytes:
		return fmt.Errorf("timeshard: job %s: its result is bytes, not JSON (%d bytes): read job.GetResult()",
			job.GetJobId(), len(job.GetResult()))
	default:
		return fmt.Errorf("timeshard: job %s: unknown result encoding %q", job.GetJobId(), enc)
	}
}

// stateName is a job state as people say it: "succeeded" for JOB_STATE_SUCCEEDED.
func stateName(s JobState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "JOB_STATE_"))
}
