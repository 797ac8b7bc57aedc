package frame

import "fmt"

// DecodeMessage decodes the body of a message of a rank's frame subject
// into f: a binary frame, or a JSON one when the body starts with '{'. A
// binary body must hold exactly one frame.
func DecodeMessage(b []byte, f *Frame) error {
	if len(b) > 0 && b[0] == '{' {
		return DecodeJSON(b, f)
	}
	n, err := DecodeBinary(b, f)
	if err != nil {
		return err
	}
	if n != len(b) {
		return fmt.Errorf("frame message has %d bytes after the frame", len(b)-n)
	}
	return nil
}
