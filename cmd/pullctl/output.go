package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// printJSON writes v indented. Protobuf messages use protojson, so field
// names are the camelCase ones crictl prints, with 64-bit integers as JSON
// numbers (see numbers).
func printJSON(w io.Writer, v any) error {
	if m, ok := v.(proto.Message); ok {
		tree, err := jsonTree(m)
		if err != nil {
			return err
		}
		v = tree
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode json: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// jsonTree is m as protojson writes it, every field present, decoded into
// maps and slices for pullctl to add its fields, with 64-bit integers as
// numbers.
func jsonTree(m proto.Message) (map[string]any, error) {
	b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode json: %w", err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var tree map[string]any
	if err := d.Decode(&tree); err != nil {
		return nil, fmt.Errorf("decode json: %w", err)
	}
	numbers(m.ProtoReflect().Descriptor(), tree)
	return tree, nil
}

// numbers turns the quoted 64-bit integers of protojson's output back into
// numbers. The proto3 JSON mapping quotes them for JavaScript, whose numbers
// lose precision past 2^53; pullctl's readers are scripts and jq, and sizes,
// counts and nanosecond times fit. The message descriptor says which
// strings are integers, so a string field that looks like a number stays a
// string.
func numbers(md protoreflect.MessageDescriptor, tree any) any {
	obj, ok := tree.(map[string]any)
	if !ok {
		return tree
	}
	for key, val := range obj {
		fd := md.Fields().ByJSONName(key)
		if fd == nil {
			continue
		}
		switch {
		case fd.IsMap():
			if m, ok := val.(map[string]any); ok {
				for k, v := range m {
					m[k] = value(fd.MapValue(), v)
				}
			}
		case fd.IsList():
			if l, ok := val.([]any); ok {
				for i, v := range l {
					l[i] = value(fd, v)
				}
			}
		default:
			obj[key] = value(fd, val)
		}
	}
	return obj
}

// value converts one value of field fd (an element, for lists and maps).
func value(fd protoreflect.FieldDescriptor, v any) any {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return numbers(fd.Message(), v)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if s, ok := v.(string); ok {
			return json.Number(s)
		}
	}
	return v
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
}
