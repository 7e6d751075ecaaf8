// Package paramstest gives tests what parley.Params keeps to itself: how many
// times a value was validated. Only tests import it; the public type carries
// no method for it.
package paramstest

import (
	"fmt"
	"reflect"

	"github.com/parley-chat/parley"
)

// Validations returns how many times Validate ran on p and on the values p
// was copied from (a Params travels by value from the edge to the engine):
// tests hold with it that a request is validated at the edge and at the
// engine's door only. It reads Params' unexported counter by reflection, and
// panics when the counter is gone, so a rename fails every test that counts.
func Validations(p *parley.Params) int {
	f := reflect.ValueOf(p).Elem().FieldByName("validations")
	if !f.IsValid() || f.Kind() != reflect.Int {
		panic(fmt.Sprintf("paramstest: parley.Params has no int field validations (%v)", f.Kind()))
	}
	return int(f.Int())
}
