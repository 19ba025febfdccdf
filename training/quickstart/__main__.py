from training.quickstart.run import main

raise SystemExit(main())
