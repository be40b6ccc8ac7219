// compose-check loads compose files with compose-go, the library Docker Compose v2 uses, the
// way `docker compose config` does, and prints the normalized project. It validates the
// project's docker-compose.yml on machines without a Docker engine or compose plugin.
//
//	compose-check [--json] [--strict] [FILE...]
//
// Without FILE it finds the file like docker compose does (COMPOSE_FILE, then compose.yaml,
// docker-compose.yml, ... in the current directory or a parent). The project directory is the
// first file's directory; the environment (and a .env file beside it) feeds interpolation.
// The load runs the compose-spec JSON schema, interpolation, normalization, consistency checks
// (unknown services in depends_on, undefined networks/volumes/secrets, ...) and path
// resolution. On top of that, the sources of bind mounts and local build contexts (with their
// Dockerfile) must exist: Docker would silently create a missing bind source as an empty
// directory. --strict makes a warning of the loader (obsolete `version`, an unset variable,
// ...) an error.
//
// Exit status: 0 valid, 1 invalid (the reason on stderr), 2 usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/sirupsen/logrus"
)

// warnings counts the loader's warnings (logged through logrus).
type warnings struct{ n int }

func (w *warnings) Levels() []logrus.Level {
	return []logrus.Level{logrus.PanicLevel, logrus.FatalLevel, logrus.ErrorLevel, logrus.WarnLevel}
}

func (w *warnings) Fire(*logrus.Entry) error {
	w.n++
	return nil
}

func main() {
	flags := flag.NewFlagSet("compose-check", flag.ContinueOnError)
	asJSON := flags.Bool("json", false, "print the normalized project as JSON instead of YAML")
	strict := flags.Bool("strict", false, "treat the loader's warnings as errors")
	quiet := flags.Bool("q", false, "only validate, print nothing on success")
	flags.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: compose-check [--json] [--strict] [-q] [FILE...]")
		flags.PrintDefaults()
	}
	if err := flags.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}

	warned := &warnings{}
	logrus.AddHook(warned)
	logrus.SetOutput(os.Stderr)

	project, err := load(flags.Args())
	if err == nil {
		err = checkPaths(project)
	}
	if err == nil && *strict && warned.n > 0 {
		err = fmt.Errorf("%d warning(s) from the loader (see above) and --strict is on", warned.n)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "compose-check: invalid: %v\n", err)
		os.Exit(1)
	}
	if *quiet {
		return
	}

	var out []byte
	if *asJSON {
		out, err = project.MarshalJSON()
	} else {
		out, err = project.MarshalYAML()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "compose-check: printing the project: %v\n", err)
		os.Exit(1)
	}
	os.Stdout.Write(out)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		fmt.Println()
	}
}

// load mirrors docker compose's project loading (cmd/compose ToProject) for local files.
func load(files []string) (*types.Project, error) {
	workingDir := ""
	if len(files) > 0 {
		abs, err := filepath.Abs(files[0])
		if err != nil {
			return nil, err
		}
		workingDir = filepath.Dir(abs)
	}
	options, err := cli.NewProjectOptions(files,
		cli.WithWorkingDirectory(workingDir),
		cli.WithOsEnv,
		cli.WithConfigFileEnv,
		cli.WithDefaultConfigPath,
		cli.WithEnvFiles(),
		cli.WithDotEnv,
		cli.WithInterpolation(true),
		cli.WithNormalization(true),
		cli.WithConsistency(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		return nil, err
	}
	if len(options.ConfigPaths) == 0 {
		return nil, errors.New("no compose file given or found (compose.yaml, docker-compose.yml, ...)")
	}
	return options.LoadProject(context.Background())
}

// checkPaths: bind-mount sources and local build contexts (and their Dockerfile) exist.
func checkPaths(project *types.Project) error {
	var problems []string
	names := make([]string, 0, len(project.Services))
	for name := range project.Services {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		service := project.Services[name]
		for _, volume := range service.Volumes {
			if volume.Type != types.VolumeTypeBind {
				continue
			}
			create := volume.Bind == nil || volume.Bind.CreateHostPath
			if _, err := os.Stat(volume.Source); err != nil {
				what := "does not exist"
				if create {
					what += " (Docker would mount an empty directory created in its place)"
				}
				problems = append(problems, fmt.Sprintf("service %q: bind mount source %s %s", name, volume.Source, what))
			}
		}
		if build := service.Build; build != nil && build.DockerfileInline == "" && isLocal(build.Context) {
			info, err := os.Stat(build.Context)
			if err != nil || !info.IsDir() {
				problems = append(problems, fmt.Sprintf("service %q: build context %s is not a directory", name, build.Context))
				continue
			}
			dockerfile := build.Dockerfile
			if dockerfile == "" {
				dockerfile = "Dockerfile"
			}
			if !filepath.IsAbs(dockerfile) {
				dockerfile = filepath.Join(build.Context, dockerfile)
			}
			if _, err := os.Stat(dockerfile); err != nil {
				problems = append(problems, fmt.Sprintf("service %q: Dockerfile %s does not exist", name, dockerfile))
			}
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// isLocal: a build context that is a path, not a Git or HTTP URL.
func isLocal(context string) bool {
	return !strings.Contains(context, "://") && !strings.HasPrefix(context, "git@")
}
